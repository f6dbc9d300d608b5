"""VectorE (and same-form GpSimd / ScalarE) element-wise ops, destination-passing.

Math is fp32, or exact int64 for integer-exact ALU ops on integer inputs (:mod:`nki_sim.alu`);
the write casts to ``dst``'s dtype.  Operand shapes: ``data[P, ...]``, per-partition operands
scalar or ``[P, 1]``.  ``engine`` names the engine charged in the trace.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as D
from .. import errors as E
from ..alu import ALU, reduce_values
from ..state import state
from .common import accumulators, as_rows, emit, free_size, operand, pvec, write_dst
from .events import tensor_tensor_attrs


def compute_fn(name, dts):
    """(NumPy function, compute dtype) of ALU op ``name`` on inputs of dtypes ``dts``."""
    fn, int_exact, kind = ALU[name]
    cdt = D.compute_dtype(dts, int_exact)
    if kind == "bitvec":
        if any(D.is_float(d) for d in dts):
            raise E.DtypeError(f"bitvec op '{name}' needs integer operands; got {[d.name for d in dts]}")
        cdt = np.dtype(np.int64)
    return fn, cdt


def tensor_tensor(dst, data1, data2, alu: str, *, engine="vector", name="", nl=False):
    """``dst = alu(data1, data2)`` element-wise (same partitions and elements per partition);
    ``nl``: an ``nki.language`` binary op lowered to it (trace attr for nki_sim.cost)."""
    a = operand(data1, "data1", "tensor_tensor", True)
    b = operand(data2, "data2", "tensor_tensor", True)
    fn, cdt = compute_fn(alu, [a.dtype, b.dtype])
    r = fn(np.asarray(a.v, cdt), np.asarray(b.v, cdt).reshape(a.v.shape))
    write_dst(dst, r, "tensor_tensor", inputs=(a, b))
    if state.traces:
        emit(engine, "tensor_tensor", (a, b), dst, name=name, attrs=tensor_tensor_attrs(alu, (a, b), nl))


def tensor_scalar(dst, data, stages, *, engine="vector", name="", unspecified=False):
    """``dst = ((data op0 s0) op1 s1)``; ``stages`` = [(alu, operand, reverse), ...];
    ``unspecified``: the kernel left the engine to the compiler (trace attr for nki_sim.cost)."""
    a = operand(data, "data", "tensor_scalar", True)
    P = a.shape[0] if a.shape else 1
    ops = [(n, operand(o, f"operand{i}", "tensor_scalar", True), rev) for i, (n, o, rev) in enumerate(stages)]
    dts = [a.dtype] + [o.dtype for _, o, _ in ops]
    cur = a.v
    for n, o, rev in ops:
        fn, cdt = compute_fn(n, dts)
        x = np.asarray(cur, cdt)
        y = np.asarray(o.v, cdt)
        if y.ndim:
            pvec(o, P, "operand", "tensor_scalar")
            y = y.reshape((y.shape[0],) + (1,) * (x.ndim - 1))
        cur = fn(y, x) if rev else fn(x, y)
    write_dst(dst, cur, "tensor_scalar", inputs=(a,) + tuple(o for _, o, _ in ops))
    attrs = {"ops": tuple(n for n, _, _ in stages)}
    if unspecified:
        attrs["engine_unspecified"] = True
    emit(engine, "tensor_scalar", (a,) + tuple(o for _, o, _ in ops), dst, name=name, attrs=attrs)


def tensor_reduce(dst, data, alu: str, axes, *, negate=False, keepdims=False, name=""):
    """Reduce the trailing free ``axes`` of ``data`` with ``alu`` into ``dst``."""
    a = operand(data, "data", "tensor_reduce", True)
    int_in = D.is_int(a.dtype) or a.dtype == D.bool_
    cdt = np.int64 if int_in and ALU[alu][1] else np.float32
    r = reduce_values(alu, np.asarray(a.v, cdt), tuple(axes), keepdims)
    if negate:
        r = -r
    write_dst(dst, r, "tensor_reduce", inputs=(a,))
    emit("vector", "tensor_reduce", (a,), dst, name=name, free_elems=free_size(a.shape))


def tensor_copy(dst, src, *, engine="vector", name="", unspecified=False):
    """``dst = src`` (bit-exact when the dtypes match; ScalarE goes through fp32);
    ``unspecified``: an ``nl.copy``, whose engine the compiler picks (trace attr for nki_sim.cost)."""
    a = operand(src, "src", "tensor_copy", True)
    v = a.v
    if engine == "scalar" and dst.arr.dtype != a.dtype:
        v = np.asarray(v, np.float32)
    write_dst(dst, v, "tensor_copy", inputs=(a,))
    emit(engine, "tensor_copy", (a,), dst, name=name,
         attrs={"engine_unspecified": True} if unspecified else None)


def copy_predicated(dst, src, predicate, *, reverse=False, name=""):
    """``dst = predicate ? src : dst`` (src a tile or a scalar)."""
    p = operand(predicate, "predicate", "tensor_copy_predicated")
    s = operand(src, "src", "tensor_copy_predicated", True)
    pv = np.broadcast_to(np.asarray(p.v).reshape(dst.shape) != 0, dst.shape)
    if reverse:
        pv = ~pv
    sv = np.broadcast_to(np.asarray(s.v), dst.shape) if s.is_scalar else np.asarray(s.v).reshape(dst.shape)
    write_dst(dst, sv, "tensor_copy_predicated", np.ascontiguousarray(pv), inputs=(s,))
    emit("vector", "tensor_copy_predicated", (p, s), dst, name=name)


def reciprocal(dst, data, *, name=""):
    a = operand(data, "data", "reciprocal", True)
    write_dst(dst, np.float32(1.0) / np.asarray(a.v, np.float32), "reciprocal", inputs=(a,))
    emit("vector", "reciprocal", (a,), dst, name=name)


def memset(dst, value, *, engine="vector", name=""):
    write_dst(dst, np.broadcast_to(np.asarray(value), dst.shape), "memset")
    emit(engine, "memset", (), dst, name=name)


def vector_reduce(cmd: str, reduce_res, values, P: int, op: str):
    """VectorE max accumulator: cmd in idle / reset / reduce / reset_reduce; reads out into
    ``reduce_res`` ([P, 1] view) when given."""
    acc = accumulators()["vector"]
    part = np.max(as_rows(np.asarray(values, np.float32), P), axis=1)
    if cmd == "reset":
        acc[:P] = -np.inf
    elif cmd == "reset_reduce":
        acc[:P] = part
    elif cmd == "reduce":
        acc[:P] = np.maximum(acc[:P], part)
    if reduce_res is not None:
        write_dst(reduce_res, acc[:P].reshape(reduce_res.shape), op)


def select_reduce(dst, predicate, on_true, on_false, *, reverse=False, reduce_cmd="idle",
                  reduce_res=None, name=""):
    """``dst = predicate ? on_true : on_false`` (on_false scalar or [P, 1]), optional row max."""
    P = dst.shape[0]
    p = operand(predicate, "predicate", "select_reduce")
    t = operand(on_true, "on_true", "select_reduce", True)
    fo = operand(on_false, "on_false", "select_reduce")
    f = pvec(fo, P, "on_false", "select_reduce")
    pv = np.asarray(p.v).reshape(dst.shape) != 0
    if reverse:
        pv = ~pv
    fv = f if np.ndim(f) == 0 else f.reshape((P,) + (1,) * (dst.ndim - 1))
    r = np.where(pv, np.asarray(t.v, np.float32).reshape(dst.shape), fv)
    write_dst(dst, r, "select_reduce", inputs=(t,))
    emit("vector", "select_reduce", (p, t, fo), dst, name=name)
    if reduce_res is not None or reduce_cmd != "idle":
        vector_reduce(reduce_cmd, reduce_res, r, P, "select_reduce")


def range_select(dst, on_true, cmp0: str, cmp1: str, bound0, bound1, *, range_start=0,
                 on_false=None, reduce_cmd="idle", reduce_res=None, name=""):
    """Keep ``on_true[p, j]`` where ``cmp0(range_start + j, b0[p]) and cmp1(.., b1[p])`` (fp32
    compare), else ``on_false`` (FP32_MIN); optional row max."""
    P = dst.shape[0]
    x = operand(on_true, "on_true_tile", "range_select", True)
    o0, o1 = operand(bound0, "bound0", "range_select"), operand(bound1, "bound1", "range_select")
    b0, b1 = pvec(o0, P, "bound0", "range_select"), pvec(o1, P, "bound1", "range_select")
    F = free_size(x.shape)
    idx = (np.float32(range_start) + np.arange(F, dtype=np.float32))[None, :]
    sel = ALU[cmp0][0](idx, b0) & ALU[cmp1][0](idx, b1)
    fmin = np.float32(np.finfo(np.float32).min if on_false is None else on_false)
    r = np.where(sel, as_rows(np.asarray(x.v, np.float32), P), fmin)
    write_dst(dst, r, "range_select", inputs=(x,))
    emit("vector", "range_select", (x, o0, o1), dst, name=name,
         attrs={"range_start": float(range_start)})
    if reduce_res is not None or reduce_cmd != "idle":
        vector_reduce(reduce_cmd, reduce_res, r, P, "range_select")


def stream_shuffle(dst, src, shuffle_mask, *, name=""):
    """Cross-partition shuffle within 32 partitions: ``dst[i] = src[shuffle_mask[i]]``; mask 255
    keeps ``dst[i]`` (AWS simulator fix, reference legacy §5)."""
    s = operand(src, "src", "nc_stream_shuffle")
    sv = as_rows(s.v, s.shape[0])
    P = dst.shape[0]
    sel = np.asarray(shuffle_mask[:P], dtype=np.int64)
    keep = sel != 255
    out = np.zeros((P, sv.shape[1]), dtype=sv.dtype)
    out[keep] = sv[sel[keep]]
    m = np.broadcast_to(keep[:, None], (P, sv.shape[1]))
    write_dst(dst, out, "nc_stream_shuffle", np.ascontiguousarray(m).reshape(dst.shape))
    emit("vector", "nc_stream_shuffle", (s,), dst, name=name)


def scalar_tensor_tensor(dst, data, alu0: str, operand0, alu1: str, operand1, *, reverse0=False,
                         reverse1=False, engine="vector", name=""):
    """``dst = (data alu0 operand0) alu1 operand1``: operand0 scalar or [P, 1], operand1 a tile."""
    a = operand(data, "data", "scalar_tensor_tensor", True)
    P = a.shape[0] if a.shape else 1
    s = operand(operand0, "operand0", "scalar_tensor_tensor")
    t = operand(operand1, "operand1", "scalar_tensor_tensor", True)
    fn0, c0 = compute_fn(alu0, [a.dtype, s.dtype])
    x = np.asarray(a.v, c0).reshape(P, -1)
    y = np.asarray(s.v, c0) if s.is_scalar else np.asarray(pvec(s, P, "operand0", "scalar_tensor_tensor"), c0)
    mid = fn0(y, x) if reverse0 else fn0(x, y)
    fn1, c1 = compute_fn(alu1, [a.dtype, t.dtype])
    z = np.asarray(t.v, c1).reshape(P, -1)
    r = fn1(z, np.asarray(mid, c1)) if reverse1 else fn1(np.asarray(mid, c1), z)
    write_dst(dst, r, "scalar_tensor_tensor", inputs=(a, t))
    emit(engine, "scalar_tensor_tensor", (a, s, t), dst, name=name,
         attrs={"ops": (alu0, alu1), **tensor_tensor_attrs(alu1, (a, t))})


def tensor_scalar_reduce(dst, data, alu0: str, operand0, reduce_alu: str, reduce_res, *, reverse0=False,
                         reduce_init=None, negate=False, name=""):
    """``dst = data alu0 operand0`` and ``reduce_res[p] = reduce(dst row p)`` (``reduce_init``
    folded in first; ``negate`` negates the reduction)."""
    a = operand(data, "data", "tensor_scalar_reduce", True)
    P = a.shape[0] if a.shape else 1
    s = operand(operand0, "operand0", "tensor_scalar_reduce")
    fn, cdt = compute_fn(alu0, [a.dtype, s.dtype])
    x = np.asarray(a.v, cdt).reshape(P, -1)
    y = np.asarray(s.v, cdt) if s.is_scalar else np.asarray(pvec(s, P, "operand0", "tensor_scalar_reduce"), cdt)
    r = fn(y, x) if reverse0 else fn(x, y)
    write_dst(dst, r, "tensor_scalar_reduce", inputs=(a,))
    emit("vector", "tensor_scalar_reduce", (a, s), dst, name=name, attrs={"reduce": True})
    if reduce_res is not None:
        red = reduce_values(reduce_alu, np.asarray(r, np.float32), 1)
        if reduce_init is not None:
            red = reduce_values(reduce_alu, np.stack([np.full(P, np.float32(reduce_init)), red]), 0)
        write_dst(reduce_res, (-red if negate else red).reshape(reduce_res.shape), "tensor_scalar_reduce",
                  inputs=(a,))


def partition_reduce(dst, data, alu: str, *, name=""):
    """``dst[0, f] = reduce over partitions p of data[p, f]`` (GpSimd)."""
    a = operand(data, "data", "tensor_partition_reduce")
    cdt = np.int64 if D.is_int(a.dtype) and ALU[alu][1] else np.float32
    r = reduce_values(alu, np.asarray(a.v, cdt).reshape(a.shape[0], -1), 0)
    write_dst(dst, r.reshape(dst.shape), "tensor_partition_reduce")
    emit("gpsimd", "tensor_partition_reduce", (a,), dst, name=name, free_elems=free_size(a.shape))
