"""nisa.scalar_tensor_tensor (legacy API): ``(data op0 operand0) op1 operand1`` on VectorE
against a float64 reference, its documented cost (that of the tensor_tensor of its op1: N with
a PSUM input, else 2N here) and the documented limits that must fail."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from nki_sim import cost
from nki_sim import errors as E

nki_sim.install()
import neuronxcc.nki as nki  # noqa: E402
import neuronxcc.nki.isa as nisa  # noqa: E402
import neuronxcc.nki.language as nl  # noqa: E402


@nki.jit
def _stt_k(x, col, y, *, case):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tx, ty, tc = nl.load(x), nl.load(y), nl.load(col)
    if case == "column":            # (x * col) + y, operand1 in PSUM
        acc = nl.ndarray(y.shape, dtype=nl.float32, buffer=nl.psum)
        acc[...] = nl.copy(ty, dtype=nl.float32)
        r = nisa.scalar_tensor_tensor(data=tx, op0=nl.multiply, operand0=tc, op1=nl.add,
                                      operand1=acc)
    elif case == "reversed":        # y - (2 - x)
        r = nisa.scalar_tensor_tensor(data=tx, op0=nl.subtract, operand0=2.0, reverse0=True,
                                      op1=nl.subtract, operand1=ty, reverse1=True,
                                      dtype=nl.float32)
    elif case == "both_psum":
        a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        b = nl.ndarray(y.shape, dtype=nl.float32, buffer=nl.psum)
        a[...] = nl.copy(tx, dtype=nl.float32)
        b[...] = nl.copy(ty, dtype=nl.float32)
        r = nisa.scalar_tensor_tensor(data=a, op0=nl.multiply, operand0=tc, op1=nl.add,
                                      operand1=b)
    elif case == "wide_column":     # operand0 of two columns
        two = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
        two[:, 0:1] = nl.copy(tc)
        two[:, 1:2] = nl.copy(tc)
        r = nisa.scalar_tensor_tensor(data=tx, op0=nl.multiply, operand0=two, op1=nl.add,
                                      operand1=ty)
    else:                           # operand1 of another shape
        r = nisa.scalar_tensor_tensor(data=tx, op0=nl.multiply, operand0=tc, op1=nl.add,
                                      operand1=ty[:, 0:8])
    nl.store(out, value=r)
    return out


def _inputs(dtype=np.float32):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 130)).astype(dtype)
    col = rng.standard_normal((64, 1)).astype(np.float32)
    y = rng.standard_normal((64, 130)).astype(dtype)
    return x, col, y


def test_column_scale_plus_psum_tile_matches_the_definition():
    x, col, y = _inputs()
    with nki_sim.tracing() as t:
        out = _stt_k(x, col, y, case="column")
    np.testing.assert_allclose(out, x.astype(np.float64) * col + y, rtol=1e-6, atol=1e-6)
    ev = [e for e in t.events if e.op == "scalar_tensor_tensor"]
    assert len(ev) == 1 and ev[0].engine == "vector"
    assert ev[0].attr("ops") == ("multiply", "add")
    assert cost.formula_cycles(ev[0], cost.TRN1) == 130              # N: operand1 in PSUM


def test_reversed_operands_and_the_bf16_fast_case():
    x, col, y = _inputs(ml_dtypes.bfloat16)
    with nki_sim.tracing() as t:
        out = _stt_k(x, col, y, case="reversed")
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    np.testing.assert_allclose(out, y64 - (2.0 - x64), rtol=1e-6, atol=1e-6)
    ev = [e for e in t.events if e.op == "scalar_tensor_tensor"][0]
    assert ev.attr("ops") == ("subtract", "subtract")
    assert cost.formula_cycles(ev, cost.TRN1) == 2 * 130               # fp32 output: 2N


@pytest.mark.parametrize("case, err, match", [
    ("both_psum", E.MemorySpaceError, "cannot both be in PSUM"),
    ("wide_column", E.NkiCompileError, "operand0 must be a scalar or a"),
    ("shape", E.NkiCompileError, "must have data's shape")])
def test_documented_limits_still_fail(case, err, match):
    x, col, y = _inputs()
    with pytest.raises(err, match=match):
        _stt_k(x, col, y, case=case)
