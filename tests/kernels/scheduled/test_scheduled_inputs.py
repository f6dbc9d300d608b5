"""The scheduled kernel's optional inputs: what only keys-on-partitions (decode-layout) classes
read -- per-item Q^T (``q_full`` / ``q_part``), the partial items' one-partition bounds
(``bounds_p``) and, with row_init, per-item init rows (``i_full`` / ``i_part``) -- are keyword
inputs defaulting to None. The host passes them only to the classes that read them; the kernel
raises a ValueError naming an input a class needs when it is None."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from host.reference import paged_attention_ref
from host.scheduled.scheduled import build_overlay, launch_args, pack_queries, unpack_output
from host.step_plan import plan_paged_attention
from nki_kernels.toolchain import resolve_api
from nki_kernels.scheduled.scheduled_attention import scheduled_paged_attention

pytestmark = pytest.mark.simulation
DECODE = ("q_full", "q_part", "bounds_p")
ROW_INIT = ("i_full", "i_part")
H, HKV = 4, 2


def _plan(batch, **variants):
    _, N, Hkv, B, d = batch.kv_cache.shape
    return plan_paged_attention(batch.block_tables, batch.query_lens, batch.context_lens,
                                num_heads=H, num_kv_heads=Hkv, head_size=d, block_size=B,
                                dtype=batch.query.dtype, num_blocks=N, large_tile_size=512,
                                backend="sim", **variants)


def _launches(batch, plan):
    """``(launch, args, inputs, kernel_kwargs)`` per class of ``plan`` on ``batch`` (the host's
    own inputs)."""
    for part in plan.parts:
        overlay = build_overlay(part.schedule, batch.kv_cache, batch.key, batch.value,
                                plan.block_tables)
        qt = pack_queries(part.launch.cls, batch.query, HKV)
        yield (part.launch, *launch_args(part.launch, qt, batch.kv_cache, overlay),
               part.kernel_kwargs)


def _run(api, args, inputs, kernel_kwargs):
    args = tuple(np.array(a) if isinstance(a, np.ndarray) else a for a in args)
    kwargs = {n: np.array(a) for n, a in inputs.items()}
    return resolve_api(api).launch(scheduled_paged_attention, args,
                                   dict(kwargs, **kernel_kwargs), num_kv_heads=HKV,
                                   device=False)


@pytest.mark.parametrize("variants, names", [({}, DECODE),
                                              (dict(sinks=np.linspace(-1, 1, H)), DECODE + ROW_INIT)],
                         ids=["plain", "row_init"])
def test_only_decode_layout_classes_get_the_optional_inputs(variants, names, batch_factory):
    b = batch_factory(21, [1, 3, 150, 1], [700, 40, 300, 1500], H=H, Hkv=HKV, d=32,
                      block_size=16)
    plan = _plan(b, **variants)
    kinds = set()
    for launch, args, inputs, _ in _launches(b, plan):
        kinds.add(launch.cls.decode_layout)
        assert len(args) == 9 and all(a is not None for a in args)
        assert sorted(inputs) == (sorted(names) if launch.cls.decode_layout else [])
        assert all(isinstance(a, np.ndarray) for a in inputs.values())
        if not launch.cls.decode_layout:
            assert launch.init_full is None and launch.init_part is None and launch.bounds is None
    assert kinds == {True, False}


@pytest.mark.parametrize("api, target", [("legacy", "trn1"), ("nki", "trn2")])
def test_decode_class_needs_each_of_its_inputs(api, target, batch_factory, tol):
    # must pass: every input given, the output matches the float64 reference; must fail: each
    # input left out is a ValueError naming it (a query-rows class runs without any of them)
    sinks = np.linspace(-1, 1, H).astype(np.float32)
    b = batch_factory(22, [1, 2, 1, 40], [300, 41, 900, 60], H=H, Hkv=HKV, d=32, block_size=16)
    plan = _plan(b, sinks=sinks)
    out = np.zeros_like(b.query)
    with nki_sim.use_target(target):
        for launch, args, inputs, kw in _launches(b, plan):
            unpack_output(launch.cls, np.asarray(_run(api, args, inputs, kw)), out)
            for name in inputs:
                what = "class with row_init" if name in ROW_INIT else "class"
                with pytest.raises(ValueError, match=rf"{name} must be given for a "
                                                     rf"decode-layout {what}"):
                    _run(api, args, {n: a for n, a in inputs.items() if n != name}, kw)
    ref = paged_attention_ref(*b.args(), sinks=sinks)
    atol, rtol = tol("mixed", b.query.dtype)
    assert np.all(np.abs(out.astype(np.float64) - ref) <= atol + rtol * np.abs(ref))
