"""nisa.tensor_scalar_reduce, nisa.bn_stats and nisa.bn_aggr (legacy API) against float64
references written from their definitions, and the documented limits that must still fail."""
from __future__ import annotations

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
def _stats_k(x):
    """mean / variance of 1000 elements per row via two bn_stats + bn_aggr; row max of 2x via
    tensor_scalar_reduce, and the sum of its element-wise result."""
    out = nl.ndarray((x.shape[0], 4), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    st = nl.ndarray((x.shape[0], 12), dtype=nl.float32, buffer=nl.sbuf)
    st[:, 0:6] = nisa.bn_stats(t[:, 0:512])
    st[:, 6:12] = nisa.bn_stats(t[:, 512:1000])
    mv = nisa.bn_aggr(st)
    mx = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    y = nisa.tensor_scalar_reduce(data=t, op0=nl.multiply, operand0=2.0, reduce_op=nl.max,
                                  reduce_res=mx)
    res = nl.ndarray((x.shape[0], 4), dtype=nl.float32, buffer=nl.sbuf)
    res[:, 0:2] = mv
    res[:, 2:3] = mx
    res[:, 3:4] = nl.sum(y, axis=1, keepdims=True)
    nl.store(out, value=res)
    return out


def test_statistics_match_their_definitions():
    x = np.random.default_rng(3).standard_normal((64, 1000)).astype(np.float32)
    with nki_sim.tracing() as t:
        out = _stats_k(x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out[:, 0], x64.mean(axis=1), atol=1e-6)
    np.testing.assert_allclose(out[:, 1], x64.var(axis=1), rtol=1e-5)
    np.testing.assert_allclose(out[:, 2], 2 * x64.max(axis=1), rtol=1e-6)
    np.testing.assert_allclose(out[:, 3], 2 * x64.sum(axis=1), rtol=1e-4, atol=1e-3)
    ops = {e.op: e for e in t.events}
    assert {"bn_stats", "bn_aggr", "tensor_scalar_reduce"} <= set(ops)
    assert all(ops[o].engine == "vector" for o in ("bn_stats", "bn_aggr", "tensor_scalar_reduce"))
    hw = cost.TRN1           # documented formulas: max(MIN_II, N) + MIN_II, max(MIN_II, 13 N / 3)
    assert cost.formula_cycles(ops["tensor_scalar_reduce"], hw) == 1000 + 64
    assert cost.formula_cycles(ops["bn_aggr"], hw) == pytest.approx(max(64, 13 * 12 / 3))


@nki.jit
def _bad_k(x, *, case):
    out = nl.ndarray((x.shape[0], 6), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    if case == "wide":
        r = nisa.bn_stats(t)                                  # > 512 elements per partition
    elif case == "aggr":
        r = nisa.bn_aggr(t[:, 0:4])                           # not (count, mean, var*n) triples
    else:
        bad = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
        r = nisa.tensor_scalar_reduce(data=t, op0=nl.add, operand0=1.0, reduce_op=nl.add,
                                      reduce_res=bad)         # reduce_res must be (P, 1)
    nl.store(out[:, 0:1], value=r[:, 0:1])
    return out


@pytest.mark.parametrize("case, err, match", [
    ("wide", E.SizeLimitError, "bn_stats_fmax"), ("aggr", ValueError, "multiple of 3"),
    ("reduce_res", E.NkiCompileError, "reduce_res must be")])
def test_documented_limits_still_fail(case, err, match):
    x = np.ones((32, 600), np.float32)
    with pytest.raises(err, match=match):
        _bad_k(x, case=case)


@nki.jit
def _masked_stats_k(x, *, rows):
    out = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    t = nl.load(x[i_p, i_f], mask=(i_p < rows))                # rows >= `rows` never written
    st = nisa.bn_stats(t[i_p, i_f], mask=(i_p < rows))
    mv = nisa.bn_aggr(st, mask=(i_p < rows))
    nl.store(out[i_p, nl.arange(2)[None, :]], value=mv, mask=(i_p < rows))
    return out


def test_masked_statistics_compute_the_selected_rows_only():
    x = np.random.default_rng(4).standard_normal((32, 40)).astype(np.float32)
    out = _masked_stats_k(x, rows=20)
    np.testing.assert_allclose(out[:20, 0], x[:20].astype(np.float64).mean(axis=1), atol=1e-6)
    np.testing.assert_allclose(out[:20, 1], x[:20].astype(np.float64).var(axis=1), rtol=1e-5)
