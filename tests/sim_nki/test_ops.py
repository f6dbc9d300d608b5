"""Numerics of every current-API compute instruction against NumPy (float64 references)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sim_nki_util import load, nisa, nki, nl, out_of, sb

BF16 = ml_dtypes.bfloat16


def test_tensor_tensor_and_scalar(rng):
    a = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((128, 64)).astype(np.float32)
    c = rng.standard_normal((128, 1)).astype(np.float32)

    @nki.jit
    def k(a, b, c):
        ta, tb, tc = load(a), load(b), load(c)
        r1, r2, r3 = sb(a.shape), sb(a.shape, nl.bfloat16), sb(a.shape)
        nisa.tensor_tensor(dst=r1, data1=ta, data2=tb, op=nl.multiply)
        nisa.tensor_scalar(dst=r2, data=ta, op0=nl.multiply, operand0=tc, op1=nl.add, operand1=2.0)
        nisa.tensor_scalar(dst=r3, data=ta, op0=nl.subtract, operand0=1.0, reverse0=True)
        return out_of(r1), out_of(r2), out_of(r3)

    r1, r2, r3 = k(a, b, c)
    np.testing.assert_allclose(r1, a.astype(np.float64) * b, rtol=1e-6)
    assert r2.dtype == BF16
    np.testing.assert_allclose(r2.astype(np.float64), a * c + 2.0, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(r3, 1.0 - a.astype(np.float64), rtol=1e-6)


def test_integer_tensor_tensor_is_exact_on_gpsimd():
    a = np.arange(128 * 4, dtype=np.int32).reshape(128, 4) * 70000
    with nki_sim_tracing() as tr:
        @nki.jit
        def k(a):
            t = load(a)
            r = sb(a.shape, nl.int32)
            nisa.tensor_tensor(dst=r, data1=t, data2=t, op=nl.add)
            return out_of(r)
        r = k(a)
    np.testing.assert_array_equal(r, a * 2)
    assert [e.engine for e in tr.events if e.op == "tensor_tensor"] == ["gpsimd"]


def nki_sim_tracing():
    import nki_sim
    return nki_sim.tracing()


def test_activation_with_reduce_and_bias(rng):
    x = rng.standard_normal((64, 96)).astype(np.float32)
    m = x.max(axis=1, keepdims=True)

    @nki.jit
    def k(x, negm):
        tx, tb = load(x), load(negm)
        e, s = sb(x.shape, nl.bfloat16), sb((64, 1))
        nisa.activation(dst=e, op=nl.exp, data=tx, bias=tb, scale=1.0, reduce_op=nl.add,
                        reduce_res=s, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        e2, s2 = sb(x.shape), sb((64, 1))
        nisa.activation_reduce(dst=e2, op=nl.exp, data=tx, reduce_op=nl.add, reduce_res=s2,
                               bias=tb, scale=0.5)
        return out_of(e), out_of(s), out_of(s2)

    e, s, s2 = k(x, -m)
    ref = np.exp(x.astype(np.float64) - m)
    np.testing.assert_allclose(e.astype(np.float64), ref, rtol=1e-2)
    np.testing.assert_allclose(s[:, 0], ref.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(s2[:, 0], np.exp(0.5 * x.astype(np.float64) - m).sum(axis=1), rtol=1e-5)


def test_reduce_copy_reciprocal_memset_predicated(rng):
    x = rng.standard_normal((32, 4, 8)).astype(np.float32)
    pred = (rng.random((32, 32)) > 0.5).astype(np.uint8)

    @nki.jit
    def k(x, pred):
        tx, tp = load(x), load(pred)
        mx, mn = sb((32, 1)), sb((32, 4))
        nisa.tensor_reduce(dst=mx, op=nl.maximum, data=tx, axis=(1, 2))
        nisa.tensor_reduce(dst=mn, op=nl.add, data=tx, axis=2, negate=True)
        rc = sb((32, 4, 8))
        nisa.reciprocal(dst=rc, data=tx)
        flat = tx.reshape((32, 32))
        d = sb((32, 32))
        nisa.memset(dst=d, value=-1.0)
        nisa.tensor_copy_predicated(dst=d, src=flat, predicate=tp)
        cp = sb((32, 32), nl.bfloat16)
        nisa.tensor_copy(dst=cp, src=d, engine=nisa.engine.gpsimd)
        return out_of(mx), out_of(mn), out_of(rc), out_of(cp)

    mx, mn, rc, cp = k(x, pred)
    np.testing.assert_allclose(mx[:, 0], x.reshape(32, -1).max(axis=1))
    np.testing.assert_allclose(mn, -x.astype(np.float64).sum(axis=2), rtol=1e-5)
    np.testing.assert_allclose(rc, 1.0 / x.astype(np.float64), rtol=1e-6)
    ref = np.where(pred != 0, x.reshape(32, 32), -1.0).astype(BF16)
    np.testing.assert_array_equal(cp, ref)


def test_matmul_accumulate_and_transpose(rng):
    a = rng.standard_normal((2, 128, 64)).astype(BF16)
    b = rng.standard_normal((2, 128, 256)).astype(BF16)

    @nki.jit
    def k(a, b):
        ps = nl.ndarray((64, 256), nl.float32, buffer=nl.psum)
        for i in range(2):
            nisa.nc_matmul(dst=ps, stationary=load(a[i]), moving=load(b[i]), accumulate=(i > 0))
        tp = nl.ndarray((64, 128), nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(dst=tp, data=load(a[0]))
        return out_of(ps), out_of(tp)

    r, t = k(a, b)
    ref = sum(a[i].astype(np.float64).T @ b[i].astype(np.float64) for i in range(2))
    np.testing.assert_allclose(r, ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(t, a[0].T)


def test_iota_affine_select_range_select_select_reduce(rng):
    x = rng.standard_normal((16, 32)).astype(np.float32)
    lo = rng.integers(0, 10, (16, 1)).astype(np.float32)
    hi = lo + 8

    @nki.jit
    def k(x, lo, hi):
        tx, tl, th = load(x), load(lo), load(hi)
        io = sb((16, 32), nl.int32)
        nisa.iota(dst=io, pattern=[[1, 32]], offset=5, channel_multiplier=100)
        af = sb((16, 32))
        nisa.affine_select(dst=af, pattern=[[-1, 32]], channel_multiplier=1, on_true_tile=tx,
                           on_false_value=-9.0, cmp_op=nl.greater_equal)
        rs, mx = sb((16, 32)), sb((16, 1))
        nisa.range_select(dst=rs, on_true_tile=tx, comp_op0=nl.greater_equal, comp_op1=nl.less,
                          bound0=tl, bound1=th, reduce_res=mx, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        pr = sb((16, 32), nl.uint8)
        nisa.tensor_copy(dst=pr, src=io.ap([[32, 16], [1, 32]]).view(nl.int32))
        sr, smx = sb((16, 32)), sb((16, 1))
        p8 = sb((16, 32), nl.uint8)
        nisa.tensor_scalar(dst=p8, data=io, op0=nl.bitwise_and, operand0=1)
        nisa.select_reduce(dst=sr, predicate=p8, on_true=tx, on_false=-5.0, reduce_res=smx,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return out_of(io), out_of(af), out_of(rs), out_of(mx), out_of(sr), out_of(smx)

    io, af, rs, mx, sr, smx = k(x, lo, hi)
    p, j = np.arange(16)[:, None], np.arange(32)[None, :]
    np.testing.assert_array_equal(io, 5 + 100 * p + j)
    np.testing.assert_array_equal(af, np.where(p - j >= 0, x, -9.0))
    keep = (j >= lo) & (j < hi)
    fmin = np.finfo(np.float32).min
    np.testing.assert_array_equal(rs, np.where(keep, x, fmin))
    np.testing.assert_array_equal(mx[:, 0], np.where(keep, x, fmin).max(axis=1))
    sel = np.where((5 + 100 * p + j) & 1, x, -5.0)
    np.testing.assert_array_equal(sr, sel)
    np.testing.assert_array_equal(smx[:, 0], sel.max(axis=1))


@pytest.mark.parametrize("dt", ["float16", "bfloat16", "float8_e4m3", "int8", "uint16", "int32"])
def test_dma_cast_roundtrip(dt, rng):
    x = (rng.standard_normal((8, 16)) * 50).astype(np.float32)

    @nki.jit
    def k(x):
        t = sb(x.shape, dt)
        nisa.dma_copy(dst=t, src=x)
        return out_of(t)

    r = k(x)
    from nki_sim.current.dtypes import to_np
    d = to_np(dt)
    if d.kind in "iu":
        info = np.iinfo(d)
        ref = np.clip(np.rint(x), info.min, info.max).astype(d)
    else:
        ref = x.astype(d)
    np.testing.assert_array_equal(r, ref)


def test_nl_wrappers(rng):
    a = rng.standard_normal((128, 32)).astype(np.float32)
    b = rng.standard_normal((128, 32)).astype(np.float32)

    @nki.jit
    def k(a, b):
        ta, tb = nl.load(a), nl.load(b)
        s = nl.add(ta, tb)
        e = nl.exp(s)
        m = nl.max(e, axis=1)
        mm = nl.matmul(ta, tb, transpose_x=True)
        o1 = nl.ndarray(s.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(o1, e)
        return o1, out_of(m), out_of(mm), out_of(nl.multiply(ta, 3.0))

    e, m, mm, x3 = k(a, b)
    np.testing.assert_allclose(e, np.exp(a.astype(np.float64) + b), rtol=1e-5)
    np.testing.assert_allclose(m[:, 0], e.max(axis=1))
    np.testing.assert_allclose(mm, a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(x3, 3 * a.astype(np.float64), rtol=1e-6)


def test_matmul_accumulate_none_groups_and_tensor_copy_dtype_keyword(rng):
    """accumulate=None: the first matmul into a fresh PSUM tile overwrites, later ones add (the
    idiom of AWS's current-API matmul tutorial, which also passes tensor_copy(dtype=))."""
    a = rng.standard_normal((3, 128, 32)).astype(BF16)
    b = rng.standard_normal((3, 128, 64)).astype(BF16)

    @nki.jit
    def k(a, b):
        ps = nl.ndarray((32, 64), nl.float32, buffer=nl.psum)
        for i in range(3):
            nisa.nc_matmul(dst=ps, stationary=load(a[i]), moving=load(b[i]))
        r = sb((32, 64))
        with pytest.warns(UserWarning, match="dtype=bfloat16 is ignored"):
            nisa.tensor_copy(dst=r, src=ps, dtype=nl.bfloat16)
        return out_of(r)

    ref = sum(a[i].astype(np.float64).T @ b[i].astype(np.float64) for i in range(3))
    np.testing.assert_allclose(k(a, b), ref, rtol=1e-4, atol=1e-3)


def test_tensor_scalar_reduce_and_partition_reduce(rng):
    x = rng.standard_normal((32, 48)).astype(np.float32)

    @nki.jit
    def k(x):
        t = load(x)
        d, m = sb((32, 48)), sb((32, 1))
        nisa.tensor_scalar_reduce(dst=d, data=t, op0=nl.multiply, operand0=0.5, reduce_op=nl.maximum,
                                  reduce_res=m)
        pr = sb((1, 48))
        nisa.tensor_partition_reduce(dst=pr, op=nl.add, data=t)
        return out_of(d), out_of(m), out_of(pr)

    d, m, pr = k(x)
    np.testing.assert_array_equal(d, x * np.float32(0.5))
    np.testing.assert_array_equal(m[:, 0], (x * np.float32(0.5)).max(axis=1))
    np.testing.assert_allclose(pr[0], x.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)


def test_scalar_tensor_tensor_matches_its_definition_and_costs_2n(rng):
    from nki_sim import cost
    from nki_sim import tracing
    x = rng.standard_normal((32, 40)).astype(np.float32)
    y = rng.standard_normal((32, 40)).astype(np.float32)
    c = rng.standard_normal((32, 1)).astype(np.float32)

    @nki.jit
    def k(x, y, c):
        tx, ty, tc = load(x), load(y), load(c)
        r = sb((32, 40))
        nisa.scalar_tensor_tensor(dst=r, data=tx, op0=nl.multiply, operand0=tc, op1=nl.add,
                                  operand1=ty)
        return out_of(r)

    with tracing() as t:
        r = k(x, y, c)
    np.testing.assert_allclose(r, x.astype(np.float64) * c + y, rtol=1e-6, atol=1e-6)
    ev = [e for e in t.events if e.op == "scalar_tensor_tensor"][0]
    assert ev.attr("ops") == ("multiply", "add")
    assert cost.formula_cycles(ev, cost.TRN2) == 2 * 40                 # 2N (fp32)


def test_scalar_tensor_tensor_operand0_of_two_columns_fails(rng):
    x = rng.standard_normal((32, 40)).astype(np.float32)

    @nki.jit
    def k(x):
        tx = load(x)
        two, r = sb((32, 2)), sb((32, 40))
        nisa.memset(dst=two, value=1.0)
        nisa.scalar_tensor_tensor(dst=r, data=tx, op0=nl.multiply, operand0=two, op1=nl.add,
                                  operand1=tx)
        return out_of(r)

    with pytest.raises(Exception, match="operand0 must be a scalar or a"):
        k(x)
