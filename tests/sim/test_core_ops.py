"""Less common ops against float64 NumPy references: scan, softmax, gather_flattened, selects."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from nki_sim import errors as E

from test_core_helpers import f32, nisa, nl, run


def _apply(*xs, fn):
    """Kernel: load every input, apply ``fn`` to the tiles, store the result (created at top level)."""
    r = fn(*[nl.load(x) for x in xs])
    out = nl.ndarray(r.shape, r.dtype, buffer=nl.shared_hbm)
    nl.store(out, r)
    return out


def test_tensor_tensor_scan(rng):
    a, b = f32(rng, 8, 16), f32(rng, 8, 16)
    init = f32(rng, 8, 1)

    out = run(_apply, a, b, init,
              fn=lambda ta, tb, ti: nisa.tensor_tensor_scan(ta, tb, ti, np.multiply, np.add))
    ref = np.empty((8, 16))
    prev = init[:, 0].astype(np.float64)
    for i in range(16):
        prev = a[:, i] * prev + b[:, i]
        ref[:, i] = prev
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_softmax(rng):
    x = f32(rng, 16, 40)
    out = run(_apply, x, fn=lambda t: nl.softmax(t, axis=1))
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    with pytest.raises(E.NkiCompileError, match="partition axis 0 cannot be reduced"):
        run(_apply, x, fn=lambda t: nl.softmax(t, axis=0))


def test_gather_flattened(rng):
    data = f32(rng, 4, 3, 5)
    idx = rng.integers(0, 15, (4, 6)).astype(np.uint32)
    out = run(_apply, data, idx, fn=nl.gather_flattened)
    assert np.array_equal(out, np.take_along_axis(data.reshape(4, 15), idx.astype(np.int64), axis=1))


def test_select_reduce_and_range_select(rng):
    x = f32(rng, 8, 32)
    pred = (rng.random((8, 32)) > 0.5).astype(np.uint8)
    lo = rng.integers(0, 16, (8, 1)).astype(np.float32)
    hi = lo + 8

    def k(x, pred, lo, hi):
        t = nl.load(x)
        dst = nl.ndarray((8, 32), nl.float32)
        mx = nl.ndarray((8, 1), nl.float32)
        nisa.select_reduce(dst=dst, predicate=nl.load(pred), on_true=t, on_false=-5.0,
                           reduce_res=mx, reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=np.amax)
        mx2 = nl.ndarray((8, 1), nl.float32)
        rs = nisa.range_select(on_true_tile=t, comp_op0=np.greater_equal, comp_op1=np.less,
                               bound0=nl.load(lo), bound1=nl.load(hi), reduce_res=mx2,
                               reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=np.amax,
                               range_start=0, on_false_value=nl.fp32.min)
        out = nl.ndarray((8, 66), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:32], dst)
        nl.store(out[:, 32:64], rs)
        nl.store(out[:, 64:65], mx)
        nl.store(out[:, 65:66], mx2)
        return out
    with pytest.raises(AttributeError, match="added in Neuron SDK 2.26"), nki_sim.configure(sdk=(2, 24)):
        run(k, x, pred, lo, hi)
    with nki_sim.configure(sdk=(2, 26)):
        out = run(k, x, pred, lo, hi)
    sel = np.where(pred != 0, x, -5.0)
    j = np.arange(32)[None, :]
    rng_sel = np.where((j >= lo) & (j < hi), x, np.finfo(np.float32).min)
    assert np.array_equal(out[:, :32], sel) and np.array_equal(out[:, 32:64], rng_sel)
    assert np.array_equal(out[:, 64], sel.max(1)) and np.array_equal(out[:, 65], rng_sel.max(1))
    with nki_sim.use_target("trn1"), nki_sim.configure(sdk=(2, 26)), \
            pytest.raises(E.TargetError, match="range_select"):
        run(k, x, pred, lo, hi)


def test_affine_select_causal(rng):
    x = f32(rng, 16, 16)

    i_p = nl.arange(16)[:, None]
    i_f = nl.arange(16)[None, :]
    out = run(_apply, x, fn=lambda t: nisa.affine_select(i_p >= i_f, t, -9984.0))
    assert np.array_equal(out, np.where(np.tri(16, dtype=bool), x, -9984.0))


@pytest.mark.parametrize("name,ref", [
    ("exp", np.exp), ("log", np.log), ("sqrt", np.sqrt), ("tanh", np.tanh),
    ("sigmoid", lambda v: 1 / (1 + np.exp(-v))), ("relu", lambda v: np.maximum(v, 0)),
    ("silu", lambda v: v / (1 + np.exp(-v))), ("square", np.square), ("abs", np.abs),
    ("rsqrt", lambda v: 1 / np.sqrt(v)), ("reciprocal", lambda v: 1 / v),
    ("gelu", lambda v: 0.5 * v * (1 + np.vectorize(__import__("math").erf)(v / np.sqrt(2)))),
])
def test_unary_math_in_fp32(rng, name, ref):
    x = rng.uniform(0.1, 3.0, (8, 16)).astype(np.float32)
    out = run(_apply, x, fn=getattr(nl, name))
    np.testing.assert_allclose(out, ref(x.astype(np.float64)), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("fn,ref", [
    ("max", np.max), ("min", np.min), ("sum", np.sum), ("mean", np.mean), ("prod", np.prod)])
def test_reductions(rng, fn, ref):
    x = rng.uniform(0.5, 1.5, (8, 4, 6)).astype(np.float32)
    out = run(_apply, x, fn=lambda t: getattr(nl, fn)(t, axis=(1, 2)))
    np.testing.assert_allclose(out, ref(x.astype(np.float64), axis=(1, 2)), rtol=1e-5)
    with pytest.raises(E.NkiCompileError, match="last contiguous free dim"):
        run(_apply, x, fn=lambda t: getattr(nl, fn)(t, axis=1))


def _acc_chain(x, *, loop):
    out = nl.ndarray((8, 2), nl.float32, buffer=nl.shared_hbm)
    for i in loop(2):
        t = nl.load(x[:, nl.ds(8 * i, 8)])
        s = nl.ndarray((8, 1), nl.float32)
        nisa.activation(np.exp, t[:, 0:4], reduce_op=np.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(np.exp, t[:, 4:8], reduce_op=np.add, reduce_cmd=nisa.reduce_cmd.reduce,
                        reduce_res=s)
        nl.store(out[:, nl.ds(i, 1)], s)
    return out


def test_accumulator_chain_across_instructions(rng):
    import warnings
    x = f32(rng, 8, 16)
    ref = np.exp(x.astype(np.float64)).reshape(8, 2, 8).sum(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(run(_acc_chain, x, loop=nl.sequential_range), ref, rtol=1e-5)
    with pytest.warns(RuntimeWarning, match="continues an engine-accumulator chain"):
        np.testing.assert_allclose(run(_acc_chain, x, loop=nl.affine_range), ref, rtol=1e-5)
