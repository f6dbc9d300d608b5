"""Fresh phases (``SchedOptions.fresh_items``, ``host.scheduled.fresh_items``): where every item
of a decode-layout phase that stores anything starts its group and none loads a state, the
items read their group's initial values from the init tile at their first step instead of
selecting them into the state (and the partial phase skips its state gathers). Read from the
simulator's trace on every target / API pair; every run matches the float64 reference, and a
promise forced onto a phase whose items load states is caught by the reference (must-fail)."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from host.reference import paged_attention_ref

pytestmark = pytest.mark.simulation

H, HKV, D, B = 8, 2, 32, 32
RUN = dict(backend="sim", kernel="scheduled", large_tile_size=4096, partial_tile_size=4096)
PAIRS = [("trn2", "nki"), ("trn2", "legacy"), ("trn1", "legacy")]


def _batch(batch_factory, contexts):
    import ml_dtypes
    return batch_factory(11, [1] * len(contexts), contexts, H=H, Hkv=HKV, d=D, block_size=B,
                         dtype=ml_dtypes.bfloat16)


def _run(batch, on_api, api, target):
    from host.attention import paged_attention
    from host.step_plan import plan_paged_attention
    with on_api(api, target):
        plan = plan_paged_attention(*batch.args()[4:], num_heads=H, num_kv_heads=HKV,
                                    head_size=D, block_size=B, dtype=batch.query.dtype,
                                    num_blocks=batch.kv_cache.shape[1], **RUN)
    with on_api(api, target), nki_sim.tracing() as trace:
        out = np.asarray(paged_attention(*batch.args(), **RUN), np.float32)
    return plan.parts[0].kernel_kwargs["options"].fresh_items, out, trace


def _state_ops(trace):
    """(state selects, state gathers): selects of a whole (rows, d + 2) state tile (``where``;
    the current API's ``tensor_copy_predicated``); DMAs into SBUF of a (rows, d + 2) fp32
    tile."""
    rows = H // HKV
    sel = [e for e in trace.events if e.op in ("where", "tensor_copy_predicated")
           and tuple(e.out_shape) == (rows, D + 2)]
    loads = [e for e in trace.events if e.engine == "dma" and e.dst_buffer == "sbuf"
             and tuple(e.out_shape) == (rows, D + 2) and e.out_dtype == "float32"]
    return len(sel), len(loads)


@pytest.mark.parametrize("target, api", PAIRS)
def test_fresh_phases_skip_the_state_select_and_load(target, api, on_api, batch_factory):
    """Contexts below one 4096-key tile: every sequence's one item starts its group in both
    phases and no state is stored or loaded, so neither phase selects or gathers a state.
    With two sequences past one tile the full phase stays fresh (one full item per sequence)
    but the partial phase loads their states: its items keep the select and the gathers."""
    short = _batch(batch_factory, [1000, 2100, 300])
    fresh, out, trace = _run(short, on_api, api, target)
    assert fresh == (True, True)
    assert np.abs(out - paged_attention_ref(*short.args())).max() < 3e-2
    assert _state_ops(trace) == (0, 0)
    long = _batch(batch_factory, [5000, 4500, 2100])
    fresh, out, trace = _run(long, on_api, api, target)
    assert fresh == (True, False)
    assert np.abs(out - paged_attention_ref(*long.args())).max() < 3e-2
    selects, loads = _state_ops(trace)
    assert selects == HKV * 3 and loads == HKV * 3     # the partial items only


@pytest.mark.parametrize("target, api", PAIRS)
def test_a_fresh_promise_over_state_loads_loses_the_full_tiles(target, api, on_api,
                                                               batch_factory, monkeypatch):
    # must-fail side: forced onto the partial phase of a batch whose first two sequences have
    # full tiles, their partial items start from the initial values instead of the loaded
    # states, so the full tiles' keys drop out of their outputs; the third sequence (no full
    # tile) is still right
    from host.scheduled import schedule
    long = _batch(batch_factory, [5000, 4500, 2100])
    ref = paged_attention_ref(*long.args())
    _, good, _ = _run(long, on_api, api, target)
    monkeypatch.setattr(schedule, "phase_fresh", lambda *a, **k: True)
    fresh, out, _ = _run(long, on_api, api, target)
    assert fresh == (True, True)
    ok = np.abs(good - ref).reshape(3, -1).max(axis=1)
    err = np.abs(out - ref).reshape(3, -1).max(axis=1)
    assert (err[:2] > 3e-2).all() and (err[:2] > 5 * ok[:2]).all()
    assert err[2] == ok[2]
