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


# ------------------------------------------------ element-wise, tensor_scalar, activation, reduce
# Each pair does the same engine work: the legacy kernel through its nl functions (and operator
# overloads), the current one through the instructions they lower to.
P, F = 128, 256


@lnki.jit
def legacy_ops(x, y, col):
    a, b, c = lnl.load(x), lnl.load(y), lnl.load(col)               # (P, F), (P, F), (P, 1) fp32
    s1 = lnl.add(a, b)                                              # tensor_tensor (nl)
    s2 = lnisa.tensor_tensor(s1, b, np.maximum)                     # tensor_tensor (nisa)
    s3 = a * b                                                      # operator: as nl.multiply
    ab = lnl.copy(a, dtype=BF16)                                    # copies (engine: compiler)
    bb = lnl.copy(b, dtype=BF16)
    s4 = lnisa.tensor_tensor(ab, bb, np.multiply, dtype=BF16)       # bf16 tensor_tensor
    s4n = lnl.multiply(ab, bb, dtype=BF16)                          # ... and its nl twin
    ps = lnl.ndarray((P, P), np.float32, buffer=lnl.psum)
    ps[...] = lnisa.nc_transpose(a[:, 0:P])
    s5 = lnl.subtract(ps, b[:, 0:P])                                # a PSUM input
    s6 = lnisa.tensor_tensor(a[:, 0:F:2], b[:, 0:P], np.add)        # a strided input
    s7 = lnisa.tensor_tensor(ab[:, 0:F:2], bb[:, 0:P], np.add, dtype=BF16)    # strided bf16
    t1 = lnl.multiply(s2, 0.5)                                      # tensor_scalar (scalar)
    t2 = lnl.subtract(s4, c, dtype=np.float32)                      # tensor_scalar ([P, 1] column)
    t3 = lnisa.tensor_scalar(t1, np.add, c, op1=np.multiply, operand1=2.0)
    t4 = 1.0 - s3                                                   # reversed scalar operand
    e1 = lnl.exp(t3)                                                # activation
    e2 = lnisa.activation(np.tanh, t2, bias=c, scale=0.5)
    r1 = lnl.sum(e1, axis=1, keepdims=True)                         # tensor_reduce
    r2 = lnl.max(e2, axis=1, keepdims=True)
    r3 = lnisa.tensor_reduce(np.add, lnl.add(s4, s4n, dtype=BF16), axis=(1,), keepdims=True,
                             dtype=np.float32)
    r4 = lnl.min(s5, axis=1, keepdims=True)
    r5 = lnl.sum(lnl.add(lnl.add(t4[:, 0:P], s6), s7), axis=1, keepdims=True)
    cp = lnisa.tensor_copy(r1)                                      # nisa.tensor_copy
    o = lnl.ndarray((P, 5), np.float32, buffer=lnl.sbuf)
    o[:, 0:1] = lnisa.tensor_tensor(cp, r2, np.add)
    o[:, 1:2] = lnisa.tensor_copy(r3)
    o[:, 2:3] = lnisa.tensor_copy(r4)
    o[:, 3:4] = lnisa.tensor_copy(r5)
    o[:, 4:5] = lnisa.tensor_copy(r2)
    out = lnl.ndarray((P, 5), np.float32, buffer=lnl.shared_hbm)
    lnl.store(out, o)
    return out


@nki.jit
def current_ops(x, y, col):
    a, b, c = nl.load(x), nl.load(y), nl.load(col)

    def sb(shape, dt=nl.float32):
        return nl.ndarray(shape, dt, buffer=nl.sbuf)

    s1 = nl.add(a, b)
    s2 = sb((P, F))
    nisa.tensor_tensor(dst=s2, data1=s1, data2=b, op=nl.maximum)
    s3 = nl.multiply(a, b)
    ab = nl.copy(a, dtype=nl.bfloat16)
    bb = nl.copy(b, dtype=nl.bfloat16)
    s4 = sb((P, F), nl.bfloat16)
    nisa.tensor_tensor(dst=s4, data1=ab, data2=bb, op=nl.multiply)
    s4n = nl.multiply(ab, bb, dtype=nl.bfloat16)
    ps = nl.ndarray((P, P), nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=ps, data=a[:, 0:P])
    s5 = sb((P, P))
    s5 = nl.subtract(ps, b[:, 0:P])
    s6 = sb((P, P))
    nisa.tensor_tensor(dst=s6, data1=a[:, 0:F:2], data2=b[:, 0:P], op=nl.add)
    s7 = sb((P, P), nl.bfloat16)
    nisa.tensor_tensor(dst=s7, data1=ab[:, 0:F:2], data2=bb[:, 0:P], op=nl.add)
    t1 = nl.multiply(s2, 0.5)
    t2 = sb((P, F))
    nisa.tensor_scalar(dst=t2, data=s4, op0=nl.subtract, operand0=c)
    t3 = sb((P, F))
    nisa.tensor_scalar(dst=t3, data=t1, op0=nl.add, operand0=c, op1=nl.multiply, operand1=2.0)
    t4 = nl.subtract(1.0, s3)
    e1 = nl.exp(t3)
    e2 = sb((P, F))
    nisa.activation(dst=e2, op=nl.tanh, data=t2, bias=c, scale=0.5)
    r1 = nl.sum(e1, axis=1, keepdims=True)
    r2 = nl.max(e2, axis=1, keepdims=True)
    r3 = sb((P, 1))
    nisa.tensor_reduce(dst=r3, op=nl.add, data=nl.add(s4, s4n), axis=(1,), keepdims=True)
    r4 = nl.min(s5, axis=1, keepdims=True)
    r5 = nl.sum(nl.add(nl.add(t4[:, 0:P], s6), s7, dtype=nl.float32), axis=1, keepdims=True)
    cp = sb((P, 1))
    nisa.tensor_copy(dst=cp, src=r1)
    o = sb((P, 5))
    nisa.tensor_tensor(dst=o[:, 0:1], data1=cp, data2=r2, op=nl.add)
    for j, r in ((1, r3), (2, r4), (3, r5), (4, r2)):
        nisa.tensor_copy(dst=o[:, j:j + 1], src=r)
    out = nl.ndarray((P, 5), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, o)
    return out


def _events(trace):
    """(engine, op, fields, attrs) of every event; DMA op names differ by API (nl.load vs
    nisa.dma_copy) and are left out."""
    return [((e.engine,) + (() if e.engine == "dma" else (e.op,)) +
             tuple(getattr(e, f) for f in FIELDS) + (e.in_shapes, e.in_dtypes, e.src_buffer, e.attrs))
            for e in trace.events]


def _same_events_and_cost(t_old, t_new):
    old, new = _events(t_old), _events(t_new)
    assert len(old) == len(new)
    for i, (a, b) in enumerate(zip(old, new)):
        assert a == b, f"event {i}: legacy {a} != current {b}"
    for target in ("trn1", "trn2"):
        a, b = cost.estimate(t_old, target), cost.estimate(t_new, target)
        assert a.modeled_us == b.modeled_us and dict(a.per_engine_us) == dict(b.per_engine_us)


def test_elementwise_scalar_activation_reduce_copy_pairs_record_the_same_events():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((P, F)).astype(np.float32)
    y = rng.standard_normal((P, F)).astype(np.float32)
    col = rng.standard_normal((P, 1)).astype(np.float32)
    with nki_sim.tracing() as t_old:
        r_old = legacy_ops(x, y, col)
    with nki_sim.tracing() as t_new:
        r_new = current_ops(x, y, col)
    np.testing.assert_array_equal(r_old, r_new)
    # independent float64 reference (bf16 rounding of the copies and of s4 applied)
    bf = lambda v: np.asarray(v, np.float32).astype(BF16).astype(np.float64)  # noqa: E731
    a, b, c = x.astype(np.float64), y.astype(np.float64), col.astype(np.float64)
    s2 = np.maximum(a + b, b)
    s4 = bf(bf(a) * bf(b))
    e1 = np.exp((s2 * 0.5 + c) * 2.0)
    e2 = np.tanh((s4 - c) * 0.5 + c)
    s7 = bf(bf(a)[:, 0:F:2] + bf(b)[:, :P])
    ref = np.concatenate([e1.sum(1, keepdims=True) + e2.max(1, keepdims=True),
                          bf(2 * s4).sum(1, keepdims=True),
                          (a[:, :P].T - b[:, :P]).min(1, keepdims=True),
                          ((1.0 - a * b)[:, :P] + a[:, 0:F:2] + b[:, :P] + s7).sum(1, keepdims=True),
                          e2.max(1, keepdims=True)], axis=1)
    np.testing.assert_allclose(r_new, ref, rtol=2e-5, atol=2e-4)
    ops = [(e.engine, e.op) for e in t_new.events if e.engine != "dma"]
    tts = [e for e in t_new.events if e.op == "tensor_tensor"]
    assert len(tts) == 12 and ops.count(("vector", "tensor_scalar")) == 4
    # nl binary ops (s1, s3, s4n, s5, the three adds of r3 / r5) vs nisa.tensor_tensor; only the
    # strided bf16 add records `strided` (the one case whose documented cost depends on it)
    assert [bool(e.attr("nl")) for e in tts] == [True, False, True, False, True, True, False, False,
                                                  True, True, True, False]
    assert [bool(e.attr("strided")) for e in tts] == [False] * 7 + [True] + [False] * 4
    assert ops.count(("scalar", "activation")) == 2 and ops.count(("vector", "tensor_reduce")) == 5
    _same_events_and_cost(t_old, t_new)


# --------------------------------------------------------------------------------- select ops
@lnki.jit
def legacy_select(x, lo, hi):
    a, b0, b1 = lnl.load(x), lnl.load(lo), lnl.load(hi)             # (P, 64) / (P, 1) fp32
    i_p, i_f = lnl.arange(P)[:, None], lnl.arange(64)[None, :]
    causal = lnl.ndarray((P, 64), np.float32, buffer=lnl.sbuf)
    causal[...] = lnisa.affine_select(i_p - i_f >= 0, a, -9984.0)   # GpSimd
    pred = lnl.ndarray((P, 64), np.uint8, buffer=lnl.sbuf)
    pred[...] = lnl.greater(a, 0.25, dtype=np.uint8)
    sel = lnl.ndarray((P, 64), np.float32, buffer=lnl.sbuf)
    mx = lnl.ndarray((P, 1), np.float32, buffer=lnl.sbuf)
    lnisa.select_reduce(dst=sel, predicate=pred, on_true=causal, on_false=b0, reduce_res=mx,
                        reduce_cmd=lnisa.reduce_cmd.reset_reduce)
    rng_ = lnl.ndarray((P, 64), np.float32, buffer=lnl.sbuf)
    mx2 = lnl.ndarray((P, 1), np.float32, buffer=lnl.sbuf)
    rng_[...] = lnisa.range_select(on_true_tile=sel, comp_op0=np.greater_equal, comp_op1=np.less,
                                   bound0=b0, bound1=b1, reduce_cmd=lnisa.reduce_cmd.reset_reduce,
                                   reduce_res=mx2, range_start=0)
    buf = lnl.ndarray((P, 64), np.float32, buffer=lnl.sbuf)
    buf[...] = lnisa.memset((P, 64), 0.0, np.float32)
    lnisa.tensor_copy_predicated(src=rng_, dst=buf, predicate=pred)
    o = lnl.ndarray((P, 66), np.float32, buffer=lnl.sbuf)
    o[:, 0:64] = lnisa.tensor_copy(buf)
    o[:, 64:65] = lnisa.tensor_copy(mx)
    o[:, 65:66] = lnisa.tensor_copy(mx2)
    out = lnl.ndarray((P, 66), np.float32, buffer=lnl.shared_hbm)
    lnl.store(out, o)
    return out


@nki.jit
def current_select(x, lo, hi):
    a, b0, b1 = nl.load(x), nl.load(lo), nl.load(hi)
    causal = nl.ndarray((P, 64), nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=causal, pattern=[[-1, 64]], channel_multiplier=1, on_true_tile=a,
                       on_false_value=-9984.0, cmp_op=nl.greater_equal)
    pred = nl.ndarray((P, 64), nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=pred, data=a, op0=nl.greater, operand0=0.25)
    sel = nl.ndarray((P, 64), nl.float32, buffer=nl.sbuf)
    mx = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=sel, predicate=pred, on_true=causal, on_false=b0, reduce_res=mx,
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
    rng_ = nl.ndarray((P, 64), nl.float32, buffer=nl.sbuf)
    mx2 = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
    nisa.range_select(dst=rng_, on_true_tile=sel, comp_op0=nl.greater_equal, comp_op1=nl.less,
                      bound0=b0, bound1=b1, reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=mx2)
    buf = nl.ndarray((P, 64), nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=buf, value=0.0)
    nisa.tensor_copy_predicated(dst=buf, src=rng_, predicate=pred)
    o = nl.ndarray((P, 66), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o[:, 0:64], src=buf)
    nisa.tensor_copy(dst=o[:, 64:65], src=mx)
    nisa.tensor_copy(dst=o[:, 65:66], src=mx2)
    out = nl.ndarray((P, 66), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, o)
    return out


def test_select_op_pairs_record_the_same_events():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((P, 64)).astype(np.float32)
    lo = rng.integers(0, 32, (P, 1)).astype(np.float32)
    hi = lo + rng.integers(1, 32, (P, 1)).astype(np.float32)
    with nki_sim.configure(sdk="2.26"), nki_sim.tracing() as t_old:      # select_reduce: 2.26
        r_old = legacy_select(x, lo, hi)
    with nki_sim.tracing() as t_new:
        r_new = current_select(x, lo, hi)
    np.testing.assert_array_equal(r_old, r_new)
    p, j = np.arange(P)[:, None], np.arange(64)[None, :]
    causal = np.where(p >= j, x, -9984.0)
    pred = x > 0.25
    sel = np.where(pred, causal, lo)
    keep = (j >= lo) & (j < hi)
    rs = np.where(keep, sel, np.finfo(np.float32).min)
    ref = np.concatenate([np.where(pred, rs, 0.0), sel.max(1, keepdims=True),
                          rs.max(1, keepdims=True)], axis=1)
    np.testing.assert_array_equal(r_new, ref.astype(np.float32))
    ops = [(e.engine, e.op) for e in t_new.events if e.engine != "dma"]
    assert [o for o in ops if o[1] in ("affine_select", "select_reduce", "range_select",
                                        "tensor_copy_predicated")] == [
        ("gpsimd", "affine_select"), ("vector", "select_reduce"), ("vector", "range_select"),
        ("vector", "tensor_copy_predicated")]
    _same_events_and_cost(t_old, t_new)
