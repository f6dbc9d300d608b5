"""Shared access ports in the cost model (nki_sim.cost.instruction_ports, CostReport.port_us).

NeuronCore-v2 (trn1), NKI architecture guide: "VectorE and GpSimdE cannot access SBUF in
parallel", "VectorE and ScalarE cannot access PSUM in parallel" (the compiler serializes them).
NeuronCore-v3 (trn2), Trainium2 architecture guide: both lifted; VectorE's performance mode uses
a bus shared with GpSimdE. Each rule gets a case where the port binds and one where it must not.
"""
from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from nki_sim import cost

from test_core_helpers import nisa, nl, run
from test_cost import Ev

BETA = cost.TRN1.overlap_inefficiency


def op(engine, name, n, *, src="sbuf", dst="sbuf", dtype="float32", out_dtype=None, attrs=()):
    return Ev(engine=engine, op=name, partitions=128, free_elems=n, in_dtypes=(dtype,),
              out_dtype=out_dtype or dtype, bytes=128 * n * 4, src_buffer=src, dst_buffer=dst,
              attrs=attrs)


def us(ev, target):
    hw = cost.get_constants(target)
    eng = cost.assigned_engine(ev, hw)
    return cost.compute_cycles(ev, hw, eng) / hw.clock_ghz(eng) / 1e3


def test_trn1_vector_and_gpsimd_take_turns_on_sbuf():
    v = op("vector", "tensor_tensor", 2048)
    g = op("gpsimd", "tensor_scalar", 2048)
    evs = [v] * 10 + [g] * 10
    r = cost.estimate(evs, "trn1")
    tv, tg = 10 * us(v, "trn1"), 10 * us(g, "trn1")
    assert r.port_us["vector+gpsimd"] == pytest.approx(tv + tg)
    assert r.bottleneck == "vector+gpsimd"
    assert r.lower_bound_us == pytest.approx(tv + tg)
    assert r.modeled_us == pytest.approx(tv + tg)          # nothing outside the port
    # must-fail twin: the same instructions on trn2 overlap (port lifted)
    r2 = cost.estimate(evs, "trn2")
    assert r2.port_us["vector+gpsimd"] == pytest.approx(10 * us(g, "trn2"))   # GpSimd alone
    assert r2.bottleneck in cost.ENGINES
    assert r2.modeled_us == pytest.approx(10 * us(v, "trn2") + BETA * 10 * us(g, "trn2"))


def test_trn1_vector_reading_only_psum_does_not_hold_the_sbuf_port():
    v = op("vector", "tensor_tensor", 2048, src="psum", dst="psum")
    g = op("gpsimd", "tensor_scalar", 2048)
    r = cost.estimate([v] * 10 + [g] * 10, "trn1")
    assert r.port_us["vector+gpsimd"] == pytest.approx(10 * us(g, "trn1"))
    assert r.port_us["vector+scalar"] == pytest.approx(10 * us(v, "trn1"))
    # mixed PSUM + SBUF operands writing PSUM still touch SBUF
    vm = op("vector", "tensor_tensor", 2048, src="psum", dst="psum", attrs=(("sbuf_input", True),))
    assert cost.instruction_ports(vm, "vector", cost.TRN1) == ("vector+gpsimd", "vector+scalar")


def test_trn1_vector_and_scalar_take_turns_on_psum():
    v = op("vector", "tensor_reduce", 512, src="psum", dst="sbuf")
    s = op("scalar", "activation", 512, src="psum", dst="sbuf")
    s_sb = op("scalar", "activation", 512)                  # SBUF only: not on the port
    r = cost.estimate([v] * 20 + [s] * 20 + [s_sb] * 20, "trn1")
    tv, ts = 20 * us(v, "trn1"), 20 * us(s, "trn1")
    assert r.port_us["vector+scalar"] == pytest.approx(tv + ts)
    assert r.bottleneck == "vector+scalar"
    assert r.modeled_us == pytest.approx(tv + ts + BETA * 20 * us(s_sb, "trn1"))
    r2 = cost.estimate([v] * 20 + [s] * 20 + [s_sb] * 20, "trn2")
    assert r2.port_us["vector+scalar"] == 0.0 and r2.bottleneck == "scalar"


def test_trn2_performance_mode_shares_the_gpsimd_bus():
    fast = op("vector", "tensor_copy", 4096, dtype="bfloat16")         # SBUF bf16: perf mode
    slow = op("vector", "tensor_copy", 4096, dtype="float32")          # no perf mode
    g = op("gpsimd", "memset", 4096)
    hw = cost.TRN2
    assert cost.vector_perf_mode(fast, hw) and not cost.vector_perf_mode(slow, hw)
    assert cost.instruction_ports(fast, "vector", hw) == ("vector+gpsimd",)
    assert cost.instruction_ports(slow, "vector", hw) == ()
    r = cost.estimate([fast] * 40 + [g] * 10, "trn2")
    assert r.port_us["vector+gpsimd"] == pytest.approx(40 * us(fast, "trn2") + 10 * us(g, "trn2"))
    # from PSUM there is no performance mode, so no bus sharing either
    from_psum = op("vector", "tensor_copy", 4096, src="psum", dtype="bfloat16")
    assert not cost.vector_perf_mode(from_psum, hw)
    assert cost.instruction_ports(from_psum, "vector", hw) == ()
    assert not cost.vector_perf_mode(fast, cost.TRN1)       # trn1 has no performance mode


def test_events_from_the_simulator_name_their_buffers():
    """emit_compute records the destination's buffer, and PSUM + SBUF operands as sbuf_input."""
    def k(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        ps = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        ps[...] = nl.multiply(t, 2.0)
        mixed = nisa.tensor_tensor(ps, t, op=np.add)
        nl.store(out, mixed)
        return out

    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    with nki_sim.use_target("trn1"), nki_sim.tracing() as tr:
        y = run(k, x)
    np.testing.assert_array_equal(np.asarray(y), 3 * x)
    comp = [e for e in tr.events if e.engine != "dma"]
    to_psum = [e for e in comp if e.dst_buffer == "psum"]
    assert to_psum and all(e.src_buffer == "sbuf" for e in to_psum)
    mixed = [e for e in comp if e.src_buffer == "psum"]
    assert mixed and all(e.attr("sbuf_input") and e.dst_buffer == "sbuf" for e in mixed)
    for e in mixed:
        assert cost.instruction_ports(e, "vector", cost.TRN1) == ("vector+gpsimd",
                                                                  "vector+scalar")


def test_a_result_broadcast_into_a_larger_destination_is_charged_for_the_destination():
    """A legacy ``dst[...] = <(128, 1) result>`` broadcast over (128, 512) writes 512 elements
    per partition: its event is charged for them (``trace.note_write``); the same result
    assigned to a (128, 1) slice (the other side) stays one element."""
    def k(a):
        out = nl.ndarray((128, 513), dtype=nl.float32, buffer=nl.shared_hbm)
        col = nl.load(a)
        wide = nl.ndarray((128, 513), dtype=nl.float32)
        wide[:, 0:512] = nisa.activation(op=np.copy, data=col)          # broadcast
        wide[:, 512:513] = nisa.activation(op=np.copy, data=col)        # one column
        nl.store(out, wide)
        return out

    x = np.arange(128, dtype=np.float32).reshape(128, 1)
    with nki_sim.use_target("trn1"), nki_sim.tracing() as tr:
        y = run(k, x)
    np.testing.assert_array_equal(np.asarray(y), np.repeat(x, 513, axis=1))
    acts = [e for e in tr.events if e.op == "activation"]
    assert [e.free_elems for e in acts] == [512, 1]
    assert [e.bytes for e in acts] == [128 * 512 * 4, 128 * 4]
    assert all(e.dst_buffer == "sbuf" for e in acts)
