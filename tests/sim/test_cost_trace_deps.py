"""What the trace gives the cost model beyond shapes: the events each instruction depends on
(attr ``deps``, allocation granularity), the memory its inputs come from (``src_buffer``) and
whether the kernel left the engine to the compiler (``engine_unspecified``); and the engine the
cost model charges (``nki_sim.cost.assigned_engine``)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nki_sim
from nki_sim import cost

nki_sim.install()
import neuronxcc.nki as nki  # noqa: E402
import neuronxcc.nki.isa as nisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402


def _trace(kernel, *args, target="trn1"):
    with nki_sim.use_target(target), nki_sim.tracing() as t:
        kernel(*args)
    return t.events


@nki.jit
def _chain_and_independent(x):
    out = nl.ndarray((128, 4), dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.load(x)                                  # 0
    b = nl.load(x)                                  # 1
    buf = nl.ndarray((128, 4), dtype=x.dtype, buffer=nl.sbuf)
    buf[...] = nisa.activation(op=nl.exp, data=a)   # 2: reads a
    c = nisa.activation(op=nl.exp, data=b)          # 3: reads b only
    d = nl.add(buf, c)                              # 4: reads buf (written by 2) and c
    nl.store(out, value=d)                          # 5
    return out


def test_deps_name_the_last_writer_of_each_input():
    ev = _trace(_chain_and_independent, np.ones((128, 4), np.float32))
    deps = [e.attr("deps", ()) for e in ev]
    assert [e.op for e in ev] == ["load", "load", "activation", "activation", "tensor_tensor", "store"]
    assert deps == [(), (), (0,), (1,), (2, 3), (4,)]


@nki.jit
def _psum_copy_and_scalars(x, w):
    out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    xt = nl.load(x)
    wt = nl.load(w)
    ps = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
    ps[...] = nisa.nc_matmul(xt, wt)
    sb = nl.copy(ps)                                             # from PSUM
    s1 = nisa.tensor_scalar(sb, np.multiply, 2.0, op1=np.add, operand1=1.0)
    s2 = nisa.tensor_scalar(s1, np.multiply, 2.0, engine=nisa.vector_engine)
    s3 = nisa.tensor_scalar(s2, np.maximum, 0.0)                 # not ScalarE-expressible
    nl.store(out, value=s3)
    return out


def test_src_buffer_and_engine_unspecified_are_recorded():
    x = np.ones((128, 128), np.float32)
    ev = [e for e in _trace(_psum_copy_and_scalars, x, x) if e.engine != "dma"]
    by_op = [(e.op, e.src_buffer, bool(e.attr("engine_unspecified"))) for e in ev]
    assert by_op == [("nc_matmul", "sbuf", False), ("tensor_copy", "psum", True),     # nl.copy
                     ("tensor_scalar", "sbuf", True), ("tensor_scalar", "sbuf", False),
                     ("tensor_scalar", "sbuf", True)]
    assert [e.attr("ops") for e in ev[2:]] == [("multiply", "add"), ("multiply",), ("maximum",)]
    # the compiler's engine choices the profiles show; an explicit engine= is kept
    assert [cost.assigned_engine(e, cost.TRN1) for e in ev] == [
        "tensor", "scalar", "scalar", "vector", "vector"]


def test_charged_engine_moves_the_busy_time():
    x = np.ones((128, 128), np.float32)
    ev = _trace(_psum_copy_and_scalars, x, x)
    rep = cost.estimate(ev, "trn1")
    assert rep.instructions["scalar"] == 2 and rep.instructions["vector"] == 2
    off = dataclasses.replace(cost.TRN1, compiler_copies_on_scalar=0.0)
    assert cost.estimate(ev, off).instructions["vector"] == 4


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_untraced_runs_are_unaffected(target):
    x = np.ones((128, 4), np.float32)
    with nki_sim.use_target(target):
        out = _chain_and_independent(x)
    np.testing.assert_allclose(out, 2 * np.exp(1.0) * np.ones((128, 4)), rtol=1e-6)


@nki.jit
def _scalar_chain(x, n, dependent):
    out = nl.ndarray((128, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    acc = t
    for _ in range(n):
        acc = nisa.activation(op=nl.exp, data=acc if dependent else t)
    nl.store(out, value=acc)
    return out


def test_dependent_issue_latency_on_the_same_engine_only():
    """The performance guide's dependent 1-element ScalarE chain issues every 264 cycles (NC-v2);
    the same instructions without the dependency issue at MIN_II + static overhead."""
    x = np.zeros((128, 1), np.float32)
    dep = cost.estimate(_trace(_scalar_chain, x, 64, True), "trn1")
    ind = cost.estimate(_trace(_scalar_chain, x, 64, False), "trn1")
    hw = cost.TRN1
    per_dep = dep.per_engine_us["scalar"] * 1e3 * hw.scalar_clock_ghz / 64
    per_ind = ind.per_engine_us["scalar"] * 1e3 * hw.scalar_clock_ghz / 64
    assert per_dep == pytest.approx(264.0, rel=0.01) and dep.dependency_stall_us > 0   # 63 of 64 wait
    assert per_ind == pytest.approx(hw.min_ii_cycles + hw.instruction_overhead_cycles)
    assert ind.dependency_stall_us == 0
