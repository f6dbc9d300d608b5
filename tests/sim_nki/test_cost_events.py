"""Cost events the current API adds (all figures MODELED): fori_loop barriers, DGE modes,
scalar_offset DMAs, 4-byte DMA transposes, and per-core reports of logical-core launches (both
front ends)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import nki_sim
import neuronxcc.nki as lnki
import neuronxcc.nki.language as lnl
from nki_sim import cost
from sim_nki_util import load, nisa, nki, nl, sb

X = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)


def _trace(kernel, *args, lnc=None):
    with nki_sim.tracing() as tr, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        (kernel[lnc] if lnc else kernel)(*args)
    return tr


def _copies(x, runtime_loop):
    def body(i):
        t = sb((128, 64))
        nisa.dma_copy(dst=t, src=x, dge_mode=nisa.dge_mode.hwdge)
    if runtime_loop:
        nl.fori_loop(0, 3, body)
    else:
        for i in range(3):
            body(i)
    return nl.num_programs(0)


def test_fori_loop_iterations_cost_9us_each():
    a = cost.estimate(_trace(nki.jit(_copies), X, False))
    b = cost.estimate(_trace(nki.jit(_copies), X, True))
    assert a.sync_us == 0 and b.sync_us == pytest.approx(3 * cost.API.fori_iteration_ns / 1e3)
    assert b.modeled_us == pytest.approx(a.modeled_us + 27.0)


def _dma_with(mode):
    def k(x):
        t = sb((128, 64))
        nisa.dma_copy(dst=t, src=x, dge_mode=mode)
        return nl.num_programs(0)
    return nki.jit(k)


def test_dge_modes_change_descriptor_generation():
    hw = cost.TRN2
    lat = {}
    for mode in ("none", "hwdge", "swdge", "unknown"):
        ev = [e for e in _trace(_dma_with(getattr(nisa.dge_mode, mode)), X).events if e.engine == "dma"]
        c = cost.dma_instruction_cost(ev[0], hw)
        lat[mode] = (c.latency_ns, c.gpsimd_ns)
    assert lat["hwdge"][0] - lat["none"][0] == pytest.approx(hw.hwdge_ns_per_instruction)
    assert lat["unknown"] == lat["hwdge"]
    assert lat["swdge"][1] > 0 and lat["none"][1] == 0 == lat["hwdge"][1]


def test_scalar_offset_on_trn1_generates_descriptors_on_gpsimd():
    ev = [e for e in _trace(_dma_with(nisa.dge_mode.hwdge), X).events if e.engine == "dma"][0]
    import dataclasses
    so = dataclasses.replace(ev, attrs=(("hbm_contiguous", True), ("scalar_offset", True)))
    assert cost.dma_instruction_cost(so, cost.TRN1).gpsimd_ns > 0
    assert cost.dma_instruction_cost(so, cost.TRN2).gpsimd_ns == 0


def test_four_byte_dma_transpose_is_slower():
    def k(x16, x32):
        a, b = sb((64, 16), nl.bfloat16), sb((64, 16))
        nisa.dma_transpose(dst=a, src=x16)
        nisa.dma_transpose(dst=b, src=x32)
        return nl.num_programs(0)
    import ml_dtypes
    x = np.ones((16, 64), np.float32)
    evs = [e for e in _trace(nki.jit(k), x.astype(ml_dtypes.bfloat16), x).events]
    c16, c32 = (cost.dma_instruction_cost(e, cost.TRN2) for e in evs)
    assert c32.transfer_ns.max() > 2 * c16.transfer_ns.max()


def _halves(x):
    o = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    c = nl.program_id(0)
    h = x.shape[0] // nl.num_programs(0)
    t = load(x[c * h:(c + 1) * h])
    nisa.dma_copy(dst=o[c * h:(c + 1) * h], src=t)
    return o


def test_lnc2_launch_is_the_slower_core():
    tr = _trace(nki.jit(_halves), X, lnc=2)
    rep = cost.estimate_cores(tr)
    assert sorted(rep.per_core) == [0, 1]
    assert rep.launch_us == max(r.modeled_us for r in rep.per_core.values())
    one = cost.estimate_cores(_trace(nki.jit(_halves), X))
    assert list(one.per_core) == [0]
    # cost.estimate prices the launch as its slower core too: that core's report
    est = cost.estimate(tr)
    slow = rep.per_core[rep.slowest_core]
    assert est.modeled_us == rep.launch_us
    assert est.per_engine_us == slow.per_engine_us and est.hbm_bytes == slow.hbm_bytes
    # must-fail side: the same events on one core (core tags dropped) take longer
    import dataclasses
    merged = cost.estimate([dataclasses.replace(
        e, attrs=tuple(kv for kv in e.attrs if kv[0] != "core")) for e in tr.events])
    assert merged.modeled_us > est.modeled_us + 0.1
    assert merged.hbm_bytes == sum(r.hbm_bytes for r in rep.per_core.values())
    doc = tr.to_chrome_json()
    assert {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"} == {0, 1}


@lnki.jit
def _legacy_copy(a):
    b = lnl.ndarray(a.shape, dtype=a.dtype, buffer=lnl.shared_hbm)
    i, j = lnl.program_id(0), lnl.program_id(1)
    lnl.store(b[i, j], lnl.load(a[i, j]))
    return b


def test_legacy_nc_grids_run_on_two_cores():
    a = np.arange(4 * 2 * 128 * 4, dtype=np.float32).reshape(4, 2, 128, 4)
    with nki_sim.tracing() as tr:
        np.testing.assert_array_equal(_legacy_copy[lnl.spmd_dim(lnl.nc(2), 2), 2](a), a)
    assert [e.attr("core") for e in tr.events if e.op == "load"] == [0, 0, 0, 0, 1, 1, 1, 1]
    with nki_sim.tracing() as tr2:
        _legacy_copy[lnl.nc(2), 2](a[:2])
    assert [e.attr("core") for e in tr2.events if e.op == "load"] == [0, 0, 1, 1]
    with nki_sim.tracing() as tr3:
        _legacy_copy[4, 2](a)
    assert all(e.attr("core") is None for e in tr3.events)
    rep = cost.estimate_cores(tr)
    assert rep.launch_us == cost.estimate(tr).modeled_us < cost.estimate(tr3).modeled_us
    assert cost.api_constants_table().count("|") > 10


def _dma_bound(x):
    for _ in range(8):
        load(x)
    return nl.num_programs(0)


def _scalar_bound(x):
    t = load(x)
    e = sb(x.shape)
    for _ in range(64):
        nisa.activation(dst=e, op=nl.exp, data=t)
    return nl.num_programs(0)


def test_kernel_launches_run_one_after_the_other():
    """Two launches in one trace are modeled as the sum of each launch modeled alone (their
    own busiest resource, overlap and DMA fill / drain), not as one mix in which a DMA-bound
    launch would overlap a ScalarE-bound one."""
    dma_k, act_k = nki.jit(_dma_bound), nki.jit(_scalar_bound)
    with nki_sim.tracing() as both:
        dma_k(X)
        act_k(X)
    assert [e.launch for e in both.events] == sorted(e.launch for e in both.events)
    assert both.summary()["launches"] == 2
    assert {e["args"]["launch"] for e in both.to_chrome_json()["traceEvents"]
            if e["ph"] == "X"} == {1, 2}
    assert [len(g) for g in both.launches()] == [
        len(_trace(dma_k, X).events), len(_trace(act_k, X).events)]
    alone = [cost.estimate(_trace(k, X)) for k in (dma_k, act_k)]
    assert [r.bottleneck for r in alone] == ["dma", "scalar"]
    rep = cost.estimate(both)
    assert rep.launches == 2 and rep.modeled_us == alone[0].modeled_us + alone[1].modeled_us
    assert rep.per_engine_us == {k: alone[0].per_engine_us[k] + alone[1].per_engine_us[k]
                                 for k in alone[0].per_engine_us}
    assert rep.instructions["scalar"] == 64 and rep.hbm_bytes == 9 * X.nbytes
    # must-fail side: the same events as ONE launch overlap the two and model less time
    import dataclasses
    merged = cost.estimate([dataclasses.replace(e, launch=0) for e in both.events])
    assert merged.launches == 1 and merged.modeled_us < rep.modeled_us - 1.0
    # the cores of an LNC=2 launch stay one launch; two of them add their slower cores
    with nki_sim.tracing() as two, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        nki.jit(_halves)[2](X)
        nki.jit(_halves)[2](X)
    assert sorted({(e.launch, e.attr("core")) for e in two.events}) == [
        (1, 0), (1, 1), (2, 0), (2, 1)]
    one = cost.estimate_cores(_trace(nki.jit(_halves), X, lnc=2)).launch_us
    assert cost.estimate_cores(two).launch_us == pytest.approx(2 * one, rel=1e-12)
    assert cost.estimate(two).modeled_us == pytest.approx(2 * one, rel=1e-12)
    assert cost.estimate(two).launches == 2


def test_nested_traces_count_their_own_launches():
    k = nki.jit(_dma_bound)
    with nki_sim.tracing() as outer:
        k(X)
        with nki_sim.tracing() as inner:
            k(X)
    assert {e.launch for e in inner.events} == {1}
    assert [sorted({e.launch for e in g}) for g in outer.launches()] == [[1], [2]]
    assert cost.estimate(outer).modeled_us == 2 * cost.estimate(inner).modeled_us
