"""The scheduled kernel on both physical cores of a trn2 logical core when the KV heads cannot
be split between them (an odd Hkv: 1 is what a tensor-parallel rank of a GQA model usually
holds): the host cuts each class's items in two parts by group, core c runs part c of every
head (docs/layouts.md §16.3). Both APIs; outputs within tolerance of the float64 reference,
each core running its own part, and how the launch is chosen and refused (garbage safety and
worker threads with one KV head: test_scheduled_lnc.py)."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from host.attention import paged_attention
from host.reference import paged_attention_ref
from nki_kernels import toolchain
from nki_sim import cost

pytestmark = [pytest.mark.simulation,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
QLENS, CLENS = [1, 3, 150, 1, 1, 40], [700, 40, 300, 1500, 900, 0]


def _run(b, lnc, kv_cache=None):
    return paged_attention(b.query, b.key, b.value, b.kv_cache if kv_cache is None else kv_cache,
                           b.block_tables, b.query_lens, b.context_lens, backend="sim",
                           large_tile_size=512, lnc=lnc)


@pytest.mark.parametrize("api", ["nki", "legacy"])
@pytest.mark.parametrize("hkv", [1, 3])
def test_odd_kv_heads_run_on_both_cores(api, hkv, on_api, batch_factory, tol):
    b = batch_factory(51, QLENS, CLENS, H=4 * hkv, Hkv=hkv, d=32, block_size=16)
    traces, outs = {}, {}
    with on_api(api):
        for lnc in (1, 2):
            with nki_sim.tracing() as traces[lnc]:
                outs[lnc] = _run(b, lnc)
    atol, rtol = tol("mixed", b.query.dtype)
    ref = paged_attention_ref(*b.args())
    for lnc in (1, 2):
        assert np.all(np.abs(outs[lnc].astype(np.float64) - ref) <= atol + rtol * np.abs(ref))
    rep1, rep2 = (cost.estimate_cores(traces[n], "trn2") for n in (1, 2))
    assert sorted(rep2.per_core) == [0, 1]
    # each core gathers its own part's KV rows: together the one-core bytes, apart less
    hbm = [r.hbm_bytes for r in rep2.per_core.values()]
    assert all(0 < h < rep1.per_core[0].hbm_bytes for h in hbm)
    assert rep2.launch_us < 0.8 * rep1.launch_us


def test_legacy_item_parts_place_every_head_on_both_cores(on_api, batch_factory):
    # grid [nl.nc(2), Hkv]: program (c, h) -- part c of head h -- on core c
    b = batch_factory(52, QLENS, CLENS, H=6, Hkv=3, d=16, block_size=16)
    with on_api("legacy"), nki_sim.tracing() as trace:
        _run(b, 2)
    programs = {}
    for e in trace.events:
        programs.setdefault(e.attr("core", 0), set()).add(tuple(e.program_id))
    assert programs == {c: {(c, h) for h in range(3)} for c in (0, 1)}


def _api(name, target):
    return toolchain.Api(name, True, target)


def test_item_split_chooses_two_cores_for_an_odd_hkv(monkeypatch):
    monkeypatch.delenv(toolchain.LNC_ENV, raising=False)
    assert _api("nki", "trn2").lnc(None, 3) == 1                   # heads alone: no split
    assert _api("nki", "trn2").lnc(None, 3, item_split=True) == 2
    assert _api("nki", "trn2").lnc(2, 1, item_split=True) == 2
    assert _api("legacy", "trn2").lnc(None, 1, item_split=True) == 2
    assert _api("legacy", "trn1").lnc(None, 1, item_split=True) == 1
    with pytest.raises(NotImplementedError, match="trn1 logical core is one NeuronCore"):
        _api("legacy", "trn1").lnc(2, 1, item_split=True)


def test_a_schedule_in_parts_needs_a_launch_on_as_many_cores(on_api, batch_factory):
    from host.step_plan import plan_paged_attention, layer_launches
    from host.launch import launch_kernel
    from host.scheduled.scheduled import build_overlay, launch_args, pack_queries
    from nki_kernels.scheduled.scheduled_attention import scheduled_paged_attention

    b = batch_factory(54, [1, 1], [300, 90], H=2, Hkv=1, d=16, block_size=16)
    with on_api("nki"):
        plan = plan_paged_attention(b.block_tables, b.query_lens, b.context_lens, num_heads=2,
                                    num_kv_heads=1, head_size=16, block_size=16,
                                    num_blocks=b.kv_cache.shape[1], dtype=b.query.dtype,
                                    backend="sim", large_tile_size=512, lnc=2)
        (part,) = plan.parts
        assert part.schedule.classes[0].item_parts == 2
        _, (launch,) = layer_launches(plan)
        overlay = build_overlay(part.schedule, b.kv_cache, b.key, b.value, plan.block_tables)
        args, inputs = launch_args(launch, pack_queries(launch.cls, b.query, 1), b.kv_cache,
                                   overlay)
        with pytest.raises(ValueError, match="lnc must be 2 for a schedule in 2 item parts"):
            launch_kernel(scheduled_paged_attention, args, {**part.kernel_kwargs, **inputs},
                          grid_heads=1, backend="sim", api="nki", lnc=1, item_parts=2)


@pytest.mark.parametrize("target, parts, match", [
    ("trn1", 2, r"item_parts must be an int in \[1, 1\]"),
    ("trn2", 3, r"item_parts must be an int in \[1, 2\]"),
])
def test_the_kernel_checks_item_parts(target, parts, match, on_api, batch_factory):
    import dataclasses

    from host.step_plan import plan_paged_attention, layer_launches
    from host.scheduled.scheduled import build_overlay, launch_args, pack_queries
    from nki_kernels.scheduled.scheduled_attention import scheduled_paged_attention

    b = batch_factory(55, [1, 1], [300, 90], H=2, Hkv=1, d=16, block_size=16)
    with on_api("legacy", target):
        plan = plan_paged_attention(b.block_tables, b.query_lens, b.context_lens, num_heads=2,
                                    num_kv_heads=1, head_size=16, block_size=16,
                                    num_blocks=b.kv_cache.shape[1], dtype=b.query.dtype,
                                    backend="sim", large_tile_size=512, lnc=1)
        (part,) = plan.parts
        _, (launch,) = layer_launches(plan)
        overlay = build_overlay(part.schedule, b.kv_cache, b.key, b.value, plan.block_tables)
        args, inputs = launch_args(launch, pack_queries(launch.cls, b.query, 1), b.kv_cache,
                                   overlay)
        opts = dataclasses.replace(part.kernel_kwargs["options"], item_parts=parts)
        with pytest.raises(ValueError, match=match):
            toolchain.nki.simulate_kernel(scheduled_paged_attention[1, 1], *args, options=opts,
                                          **inputs)
