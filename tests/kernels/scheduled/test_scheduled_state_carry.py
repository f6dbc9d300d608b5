"""A group's state kept in SBUF from the full phase to the partial phase
(``host.scheduled.state_carry``): the kernel runs it with no state store and no state load for
that group, and the outputs are bit-identical to the same batch with the HBM round trip (the
host's ``carry_order`` turned off) and match the float64 reference, alone and in a mixed
batch's pair launch, on every target / API pair."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.reference import paged_attention_ref

pytestmark = pytest.mark.simulation
PAIRS = [("trn2", "nki"), ("trn2", "legacy"), ("trn1", "legacy")]
D = 16


def _state_dmas(trace):
    """DMAs of whole fp32 group states (128 rows x (d + 2) columns per block) to / from HBM."""
    return [e for e in trace.events if e.engine == "dma" and e.out_dtype == "float32"
            and "hbm" in (e.src_buffer, e.dst_buffer) and e.bytes
            and e.out_shape[-1] % (D + 2) == 0 and e.out_shape[0] == 128]


@pytest.mark.parametrize("target, api", PAIRS)
@pytest.mark.parametrize("with_decode", [False, True])
def test_a_carried_group_skips_its_round_trip_bit_for_bit(target, api, with_decode, on_api,
                                                          batch_factory, monkeypatch):
    from host.attention import paged_attention
    from host.scheduled import schedule
    q, c = [300, 200] + [1] * with_decode, [4700, 500] + [900] * with_decode
    batch = batch_factory(5, q, c, H=8, Hkv=2, d=D, block_size=16, dtype=ml_dtypes.bfloat16)
    run = dict(backend="sim", kernel="scheduled", large_tile_size=512, partial_tile_size=512)
    outs, dmas = {}, {}
    for carry in (True, False):
        if not carry:
            monkeypatch.setattr(schedule, "carry_order", lambda f, p, w, decode: (f, p, None))
        with on_api(api, target), nki_sim.tracing() as trace:
            outs[carry] = np.asarray(paged_attention(*batch.args(), **run), np.float32)
        dmas[carry] = _state_dmas(trace)
    ref = paged_attention_ref(*batch.args())
    assert np.abs(outs[True] - ref).max() < 3e-2
    assert outs[True].tobytes() == outs[False].tobytes()
    # seq 0's group (the only one with full tiles), per KV head: one state store and one state
    # load fewer (where a prefill launch resets states by DMA, sched_item.reset_by_dma, also its
    # reset: its first partial item continues the group)
    stores = {k: len([e for e in v if e.dst_buffer == "hbm"]) for k, v in dmas.items()}
    loads = {k: len(v) - stores[k] for k, v in dmas.items()}
    assert stores[False] - stores[True] == 2 and loads[False] - loads[True] >= 2
