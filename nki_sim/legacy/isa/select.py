"""VectorE select instructions: select_reduce, range_select (gen3), tensor_copy_predicated."""

from __future__ import annotations

import numpy as np

from ... import dtypes as D
from ... import errors as E
from ... import sdk
from ...access import write
from ...alu import ALU, alu_name
from ..compute import emit_compute, free_size, operand, require_kernel, result_tile
from ...indexing import mask_array
from ...target import get_target
from ...tensor import Tensor
from .constants import reduce_cmd as _reduce_cmd
from .scalar_vector import accumulators, pvec, warn_accumulator_chain


def _vector_reduce(cmd, reduce_res, out, P, api):
    cmd = _reduce_cmd(cmd)
    if reduce_res is not None and cmd == _reduce_cmd.idle:
        cmd = _reduce_cmd.reset_reduce
    acc = accumulators()["vector"]
    part = np.max(np.asarray(out, np.float32).reshape(P, -1), axis=1)
    if cmd == _reduce_cmd.reset:
        acc[:P] = -np.inf
    elif cmd == _reduce_cmd.reset_reduce:
        acc[:P] = part
    elif cmd == _reduce_cmd.reduce:
        warn_accumulator_chain(api)
        acc[:P] = np.maximum(acc[:P], part)
    if reduce_res is not None:
        if not isinstance(reduce_res, Tensor) or reduce_res.shape[0] != P or \
                free_size(reduce_res.shape) != 1:
            raise E.NkiCompileError(f"{api}: reduce_res must be a tile view of shape ({P}, 1)")
        write(reduce_res, acc[:P].reshape((P,) + (1,) * (reduce_res.ndim - 1)), op=api)


def select_reduce(*, dst, predicate, on_true, on_false, reduce_res=None,
                  reduce_cmd=_reduce_cmd.idle, reduce_op=np.amax, reverse_pred=False, mask=None,
                  dtype=None, name="", **kwargs):
    """``dst = predicate ? on_true : on_false`` (in place) with an optional per-partition max."""
    require_kernel("nisa.select_reduce")
    if alu_name(reduce_op, "nisa.select_reduce reduce_op") != "maximum":
        raise ValueError("nisa.select_reduce: reduce_op must be np.amax / nl.max")
    if not isinstance(dst, Tensor) or not isinstance(on_true, Tensor) or not isinstance(predicate, Tensor):
        raise TypeError("nisa.select_reduce: dst, predicate and on_true must be tiles")
    if predicate.dtype not in (D.int8, D.uint8, D.int16, D.uint16, D.bool_):
        raise E.DtypeError(f"nisa.select_reduce: predicate must be int8/uint8/int16/uint16; got "
                           f"{predicate.dtype.name}")
    if on_true.dtype in (D.int32, D.uint32) or on_true.dtype == D.tfloat32:
        raise E.DtypeError(f"nisa.select_reduce: on_true can be any supported dtype except tfloat32, "
                           f"int32, uint32; got {on_true.dtype.name}")
    P = dst.shape[0]
    m = mask_array(mask, dst.shape) if mask is not None else None
    p = operand(predicate, "predicate", "select_reduce", m)
    t = operand(on_true, "on_true", "select_reduce", m)
    f, fo = pvec(on_false, "on_false", "select_reduce", P)
    pv = np.asarray(p.v).reshape(dst.shape) != 0
    if reverse_pred:
        pv = ~pv
    fv = f if np.ndim(f) == 0 else f.reshape((P,) + (1,) * (len(dst.shape) - 1))
    r = np.where(pv, np.asarray(t.v, np.float32).reshape(dst.shape), fv)
    write(dst, r, m, op="select_reduce")
    emit_compute("vector", "select_reduce", (p, t) + ((fo,) if fo else ()), dst, name=name)
    if reduce_res is not None or reduce_cmd != _reduce_cmd.idle:
        _vector_reduce(reduce_cmd, reduce_res, r, P, "nisa.select_reduce")


def range_select(*, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=_reduce_cmd.idle,
                 reduce_res=None, reduce_op=np.amax, range_start=0, on_false_value=None, mask=None,
                 dtype=None, name="", **kwargs):
    """Keep ``on_true_tile[p, f]`` where ``comp_op0(idx, bound0[p]) & comp_op1(idx, bound1[p])``
    with ``idx = range_start + f``, else FP32_MIN; optional per-partition max (NeuronCore-v3+)."""
    require_kernel("nisa.range_select")
    tgt = get_target()
    if not tgt.has_range_select:
        raise E.TargetError(f"nisa.range_select requires NeuronCore-v3 (trn2); target is {tgt.name}")
    fmin = float(np.finfo(np.float32).min)
    if on_false_value is not None and float(on_false_value) != fmin:
        raise ValueError(f"nisa.range_select: on_false_value must be nl.fp32.min; got {on_false_value}")
    if alu_name(reduce_op, "nisa.range_select reduce_op") != "maximum":
        raise ValueError("nisa.range_select: reduce_op must be np.amax")
    if not isinstance(on_true_tile, Tensor):
        raise TypeError("nisa.range_select: on_true_tile must be a tile")
    P = on_true_tile.shape[0]
    F = free_size(on_true_tile.shape)
    m = mask_array(mask, on_true_tile.shape) if mask is not None else None
    x = operand(on_true_tile, "on_true_tile", "range_select", m)
    b0, o0 = pvec(bound0, "bound0", "range_select", P)
    b1, o1 = pvec(bound1, "bound1", "range_select", P)
    c0 = ALU[alu_name(comp_op0, "nisa.range_select comp_op0")][0]
    c1 = ALU[alu_name(comp_op1, "nisa.range_select comp_op1")][0]
    idx = (np.float32(range_start) + np.arange(F, dtype=np.float32))[None, :]
    sel = c0(idx, b0) & c1(idx, b1)
    r = np.where(sel, np.asarray(x.v, np.float32).reshape(P, F), np.float32(fmin))
    out_dt = D.as_dtype(dtype) if dtype is not None else x.dtype
    res = result_tile(r.reshape(on_true_tile.shape), out_dt, op="range_select", engine="vector",
                      inputs=tuple(o for o in (x, o0, o1) if o is not None), mask=m, name=name,
                      attrs={"range_start": float(range_start)})
    if reduce_res is not None or reduce_cmd != _reduce_cmd.idle:
        _vector_reduce(reduce_cmd, reduce_res, r, P, "nisa.range_select")
    return res


def tensor_copy_predicated(*, src, dst, predicate, reverse_pred=False, mask=None, name="", **kwargs):
    """``dst = predicate ? src : dst`` in place (VectorE)."""
    require_kernel("nisa.tensor_copy_predicated")
    sdk.check_kwargs("nisa.tensor_copy_predicated", (2, 23), reverse_pred=reverse_pred or None)
    if not all(isinstance(t, Tensor) for t in (src, dst, predicate)):
        raise TypeError("nisa.tensor_copy_predicated: src, dst and predicate must be tiles")
    m = mask_array(mask, dst.shape) if mask is not None else None
    p = operand(predicate, "predicate", "tensor_copy_predicated", m)
    s = operand(src, "src", "tensor_copy_predicated", m)
    pv = np.broadcast_to(np.asarray(p.v) != 0, dst.shape)
    if reverse_pred:
        pv = ~pv
    wm = pv if m is None else (pv & m)
    write(dst, np.asarray(s.v).reshape(dst.shape), wm, op="tensor_copy_predicated")
    emit_compute("vector", "tensor_copy_predicated", (p, s), dst, name=name)


def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *,
                       dtype=None, mask=None, name="", **kwargs):
    """Scan along the (flattened) free axis: ``r[:, i] = op1(op0(d0[:, i], r[:, i-1]), d1[:, i])``
    with ``r[:, -1] = initial`` (scalar or [P, 1]); ``reverse*`` swaps an op's operands (VectorE, fp32)."""
    require_kernel("nisa.tensor_tensor_scan")
    for pname, t in (("data0", data0), ("data1", data1)):
        if not isinstance(t, Tensor):
            raise TypeError(f"nisa.tensor_tensor_scan: {pname} must be a tile")
    if data0.shape != data1.shape:
        raise E.NkiCompileError(f"nisa.tensor_tensor_scan: data0{list(data0.shape)} and "
                                f"data1{list(data1.shape)} must have the same shape")
    P = data0.shape[0]
    m = mask_array(mask, data0.shape) if mask is not None else None
    a = operand(data0, "data0", "tensor_tensor_scan", m)
    b = operand(data1, "data1", "tensor_tensor_scan", m)
    init, io = pvec(initial, "initial", "tensor_tensor_scan", P)
    f0 = ALU[alu_name(op0, "nisa.tensor_tensor_scan op0")][0]
    f1 = ALU[alu_name(op1, "nisa.tensor_tensor_scan op1")][0]
    x0 = np.asarray(a.v, np.float32).reshape(P, -1)
    x1 = np.asarray(b.v, np.float32).reshape(P, -1)
    prev = np.broadcast_to(np.asarray(init, np.float32).reshape(-1), (P,)).copy()
    out = np.empty_like(x0)
    for i in range(x0.shape[1]):
        t = f0(prev, x0[:, i]) if reverse0 else f0(x0[:, i], prev)
        prev = f1(x1[:, i], t) if reverse1 else f1(t, x1[:, i])
        out[:, i] = prev
    out_dt = D.as_dtype(dtype) if dtype is not None else D.promote(a.dtype, b.dtype)
    return result_tile(out.reshape(data0.shape), out_dt, op="tensor_tensor_scan", engine="vector",
                       inputs=tuple(o for o in (a, b, io) if o is not None), mask=m, name=name)
