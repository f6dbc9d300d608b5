"""The same engine work written in the legacy and the current API records the same events and
the same modeled time (the engine layer keeps the legacy field conventions)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import nki_sim
import neuronxcc.nki as lnki
import neuronxcc.nki.isa as lnisa
import neuronxcc.nki.language as lnl
from nki_sim import cost
from sim_nki_util import nisa, nki, nl

BF16 = ml_dtypes.bfloat16


@lnki.jit
def legacy(q, k, idx):
    it = lnl.load(idx)
    kt = lnl.ndarray((128, 64), BF16, buffer=lnl.sbuf)
    i_f = lnl.arange(64)[None, :]
    kt[...] = lnl.load(k[it[lnl.arange(128)[:, None], 0], i_f])
    qt = lnl.ndarray((128, 64), BF16, buffer=lnl.sbuf)
    lnisa.dma_copy(dst=qt, src=q)
    ps = lnl.ndarray((64, 64), np.float32, buffer=lnl.psum)
    ps[...] = lnisa.nc_matmul(qt, kt)
    e = lnl.ndarray((64, 64), BF16, buffer=lnl.sbuf)
    s = lnl.ndarray((64, 1), np.float32, buffer=lnl.sbuf)
    e[...] = lnisa.activation(op=np.exp, data=ps, reduce_op=np.add, reduce_res=s,
                              reduce_cmd=lnisa.reduce_cmd.reset_reduce, dtype=BF16)
    m = lnl.ndarray((64, 1), np.float32, buffer=lnl.sbuf)
    m[...] = lnisa.tensor_reduce(np.max, e, axis=(1,), dtype=np.float32, keepdims=True)
    r = lnl.ndarray((64, 64), BF16, buffer=lnl.sbuf)
    r[...] = lnisa.tensor_scalar(e, np.multiply, m, dtype=BF16)
    out = lnl.ndarray((64, 64), BF16, buffer=lnl.shared_hbm)
    lnisa.dma_copy(dst=out, src=r)
    return out


@nki.jit
def current(q, k, idx):
    it = nl.ndarray((128, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=it, src=idx)
    kt = nl.ndarray((128, 64), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=kt, src=k.ap([[64, 128], [1, 64]], vector_offset=it, indirect_dim=0))
    qt = nl.ndarray((128, 64), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=qt, src=q)
    ps = nl.ndarray((64, 64), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=qt, moving=kt)
    e = nl.ndarray((64, 64), nl.bfloat16, buffer=nl.sbuf)
    s = nl.ndarray((64, 1), nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=ps, reduce_op=nl.add, reduce_res=s,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    m = nl.ndarray((64, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=m, op=nl.maximum, data=e, axis=(1,))
    r = nl.ndarray((64, 64), nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=e, op0=nl.multiply, operand0=m)
    out = nl.ndarray((64, 64), nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=r)
    return out


FIELDS = ("engine", "partitions", "free_elems", "bytes", "out_shape", "out_dtype", "dma_kind",
          "descriptor_bytes", "skipped_rows")


def test_same_work_same_events_and_cost():
    rng = np.random.default_rng(7)
    q = (rng.standard_normal((128, 64)) * 0.1).astype(BF16)
    k = (rng.standard_normal((300, 64)) * 0.1).astype(BF16)
    idx = rng.permutation(300)[:128].astype(np.int32).reshape(128, 1)
    with nki_sim.tracing() as t_old:
        r_old = legacy(q, k, idx)
    with nki_sim.tracing() as t_new:
        r_new = current(q, k, idx)
    np.testing.assert_array_equal(r_old, r_new)
    old = [tuple(getattr(e, f) for f in FIELDS) for e in t_old.events]
    new = [tuple(getattr(e, f) for f in FIELDS) for e in t_new.events]
    assert old == new
    assert [(e.engine, e.op) for e in t_old.events if e.engine != "dma"] == \
        [(e.engine, e.op) for e in t_new.events if e.engine != "dma"]
    for target in ("trn1", "trn2"):
        a, b = cost.estimate(t_old, target), cost.estimate(t_new, target)
        assert a.modeled_us == b.modeled_us and dict(a.per_engine_us) == dict(b.per_engine_us)


@lnki.jit
def legacy_misc(x):
    t = lnl.ndarray((64, 32), np.float32, buffer=lnl.sbuf)
    lnisa.dma_copy(dst=t, src=x)
    tp = lnl.ndarray((32, 64), np.float32, buffer=lnl.psum)
    tp[...] = lnisa.nc_transpose(t)
    ts = lnl.ndarray((32, 64), np.float32, buffer=lnl.sbuf)
    ts[...] = lnisa.tensor_copy(tp)
    io = lnl.ndarray((32, 64), np.int32, buffer=lnl.sbuf)
    io[...] = lnisa.iota(lnl.arange(64)[None, :] + 64 * lnl.arange(32)[:, None], dtype=np.int32)
    m = lnl.ndarray((32, 64), np.float32, buffer=lnl.sbuf)
    m[...] = lnisa.memset((32, 64), 0.5, np.float32)
    r = lnl.ndarray((32, 64), np.float32, buffer=lnl.sbuf)
    r[...] = lnisa.tensor_tensor(ts, m, np.multiply)
    d = lnl.ndarray((64, 32), BF16, buffer=lnl.sbuf)
    d[...] = lnisa.dma_transpose(_bf(r))
    out = lnl.ndarray((64, 32), BF16, buffer=lnl.shared_hbm)
    lnisa.dma_copy(dst=out, src=d)
    return out


def _bf(r):
    b = lnl.ndarray((32, 64), BF16, buffer=lnl.sbuf)
    b[...] = lnisa.tensor_copy(r, dtype=BF16)
    return b


@nki.jit
def current_misc(x):
    t = nl.ndarray((64, 32), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    tp = nl.ndarray((32, 64), nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=t)
    ts = nl.ndarray((32, 64), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ts, src=tp)
    io = nl.ndarray((32, 64), nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=io, pattern=[[1, 64]], offset=0, channel_multiplier=64)
    m = nl.ndarray((32, 64), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=m, value=0.5)
    r = nl.ndarray((32, 64), nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=r, data1=ts, data2=m, op=nl.multiply)
    b = nl.ndarray((32, 64), nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=b, src=r)
    d = nl.ndarray((64, 32), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_transpose(dst=d, src=b)
    out = nl.ndarray((64, 32), nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=d)
    return out


def test_second_kernel_pair_same_events_and_cost():
    x = np.random.default_rng(3).standard_normal((64, 32)).astype(np.float32)
    with nki_sim.tracing() as t_old:
        r_old = legacy_misc(x)
    with nki_sim.tracing() as t_new:
        r_new = current_misc(x)
    np.testing.assert_array_equal(r_old, r_new)
    np.testing.assert_array_equal(r_new, (x * 0.5).astype(BF16))
    old = [(e.engine, e.op) + tuple(getattr(e, f) for f in FIELDS) for e in t_old.events]
    new = [(e.engine, e.op) + tuple(getattr(e, f) for f in FIELDS) for e in t_new.events]
    assert old == new
    for target in ("trn1", "trn2"):
        assert cost.estimate(t_old, target).modeled_us == cost.estimate(t_new, target).modeled_us
