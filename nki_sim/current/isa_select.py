"""GpSimd pattern ops and VectorE selects of ``nki.isa``: iota, affine_select, range_select,
select_reduce (reference §4.3)."""

from __future__ import annotations

import math

import numpy as np

from ..alu import alu_name
from ..engines import gpsimd as G, vector as V
from ..target import get_target
from .checks import require_kernel, buffer_in, fail, partitions, same_partition_layout, tile
from .enums import member, reduce_cmd as _rc
from .ndarray import NkiTensor

FP32_MIN = float(np.finfo(np.float32).min)


def _pattern(pattern, op):
    try:
        pat = [(int(s), int(n)) for s, n in pattern]
    except (TypeError, ValueError):
        raise ValueError(f"{op}: pattern must be a list of [step, num] pairs; got {pattern!r}") from None
    if len(pat) > 4:
        fail(f"{op}: pattern has at most 4 dims; got {len(pat)}")
    return pat


def _fits(op, dst, pat):
    n = math.prod(c for _, c in pat)
    if dst.size != dst.shape[0] * n:
        fail(f"{op}: dst {list(dst.shape)} does not match pattern {[list(p) for p in pat]} "
             f"({dst.shape[0]} x {n} elements)")


def iota(dst, pattern, offset=0, channel_multiplier=0, name=""):
    """``dst[p, i..] = offset + p * channel_multiplier + sum(step * i)`` (int32, cast to dst)."""
    require_kernel("nisa.iota")
    dst = tile(dst, "iota", "dst")
    buffer_in("iota dst", dst, ("sbuf",))
    partitions("iota", "dst", dst)
    pat = _pattern(pattern, "iota")
    _fits("iota", dst, pat)
    G.iota(dst.core(), pat, int(offset), int(channel_multiplier), name=name)


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=None,
                  offset=0, name=""):
    """``dst = cmp_op(affine, 0) ? on_true_tile : on_false_value`` (GpSimd, SBUF only)."""
    require_kernel("nisa.affine_select")
    dst, src = tile(dst, "affine_select", "dst"), tile(on_true_tile, "affine_select", "on_true_tile")
    buffer_in("affine_select dst", dst, ("sbuf",))
    buffer_in("affine_select on_true_tile", src, ("sbuf",))
    partitions("affine_select", "dst", dst)
    same_partition_layout("affine_select", [("dst", dst), ("on_true_tile", src)])
    pat = _pattern(pattern, "affine_select")
    _fits("affine_select", dst, pat)
    cmp = alu_name(cmp_op if cmp_op is not None else "equal", "nisa.affine_select cmp_op")
    G.affine_select(dst.core(), pat, int(channel_multiplier), src.core(), float(on_false_value),
                    cmp=cmp, offset=int(offset), name=name)


def _reduce_res(reduce_res, P, op):
    if reduce_res is None:
        return None
    r = tile(reduce_res, op, "reduce_res")
    if r.shape[0] != P or r.size != P:
        fail(f"{op}: reduce_res must be a [{P}, 1] tile; got {list(r.shape)}")
    return r.core()


def _pvec(x, P, op, pname):
    if isinstance(x, NkiTensor):
        if x.shape[0] != P or math.prod(x.shape[1:]) != 1:
            fail(f"{op}: {pname} must be a scalar or a [{P}, 1] tile; got {list(x.shape)}")
        return x.core()
    return float(x)


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=None,
                 reduce_res=None, reduce_op=None, range_start=0, on_false_value=FP32_MIN, name=""):
    """Keep ``on_true[p, j]`` where ``op0(range_start + j, b0[p]) and op1(.., b1[p])``, else
    FP32_MIN (NeuronCore-v3+), with the VectorE max accumulator."""
    require_kernel("nisa.range_select")
    tgt = get_target()
    if not tgt.has_range_select:
        from ..errors import TargetError
        raise TargetError(f"nisa.range_select requires NeuronCore-v3+ (trn2); the target is {tgt.name}")
    dst, src = tile(dst, "range_select", "dst"), tile(on_true_tile, "range_select", "on_true_tile")
    same_partition_layout("range_select", [("dst", dst), ("on_true_tile", src)])
    partitions("range_select", "dst", dst)
    if float(on_false_value) != FP32_MIN:
        fail(f"range_select: on_false_value must be FP32_MIN ({FP32_MIN}); got {on_false_value}")
    if reduce_op is not None and alu_name(reduce_op, "nisa.range_select reduce_op") != "maximum":
        fail("range_select: reduce_op must be nl.maximum")
    for pname, b in (("bound0", bound0), ("bound1", bound1)):
        if isinstance(b, NkiTensor) and b.dtype != "float32":
            fail(f"range_select: {pname} must be a float32 [P, 1] tile; got {b.dtype}")
    P = dst.shape[0]
    cmd = member(_rc, reduce_cmd, "reduce_cmd", _rc.reset_reduce).name
    V.range_select(dst.core(), src.core(), alu_name(comp_op0, "nisa.range_select comp_op0"),
                   alu_name(comp_op1, "nisa.range_select comp_op1"), _pvec(bound0, P, "range_select", "bound0"),
                   _pvec(bound1, P, "range_select", "bound1"), range_start=float(range_start),
                   reduce_cmd=cmd, reduce_res=_reduce_res(reduce_res, P, "range_select"), name=name)


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=None,
                  reduce_op=None, reverse_pred=False, name=""):
    """``dst = predicate ? on_true : on_false`` (on_false fp32 scalar or [P, 1]) + row max."""
    require_kernel("nisa.select_reduce")
    dst = tile(dst, "select_reduce", "dst")
    pred, src = tile(predicate, "select_reduce", "predicate"), tile(on_true, "select_reduce", "on_true")
    if pred.dtype not in ("int8", "uint8", "int16", "uint16", "bool"):
        fail(f"select_reduce: predicate must be an 8- or 16-bit integer tile; got {pred.dtype}")
    if reduce_op is not None and alu_name(reduce_op, "nisa.select_reduce reduce_op") != "maximum":
        fail("select_reduce: reduce_op must be nl.maximum")
    same_partition_layout("select_reduce", [("dst", dst), ("predicate", pred), ("on_true", src)])
    P = dst.shape[0]
    cmd = member(_rc, reduce_cmd, "reduce_cmd", _rc.idle).name
    V.select_reduce(dst.core(), pred.core(), src.core(), _pvec(on_false, P, "select_reduce", "on_false"),
                    reverse=bool(reverse_pred), reduce_cmd=cmd,
                    reduce_res=_reduce_res(reduce_res, P, "select_reduce"), name=name)


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=None, reduce_init=None, reduce_res_negate=False, name=""):
    """``dst = data op0 operand0`` with a per-partition ``reduce_op`` (add / multiply / maximum /
    minimum) of the result into ``reduce_res`` ([P, 1]); ``reduce_cmd`` reset_reduce only."""
    require_kernel("nisa.tensor_scalar_reduce")
    dst, data = tile(dst, "tensor_scalar_reduce", "dst"), tile(data, "tensor_scalar_reduce", "data")
    same_partition_layout("tensor_scalar_reduce", [("dst", dst), ("data", data)])
    partitions("tensor_scalar_reduce", "dst", dst)
    ralu = alu_name(reduce_op, "nisa.tensor_scalar_reduce reduce_op")
    if ralu not in ("add", "multiply", "maximum", "minimum"):
        fail(f"tensor_scalar_reduce: reduce_op must be add, multiply, maximum or minimum; got {ralu}")
    cmd = member(_rc, reduce_cmd, "reduce_cmd", _rc.reset_reduce)
    if cmd is not _rc.reset_reduce:
        from ..errors import not_emulated
        raise not_emulated(f"nisa.tensor_scalar_reduce(reduce_cmd={cmd.name})", "use reset_reduce")
    P = dst.shape[0]
    V.tensor_scalar_reduce(dst.core(), data.core(), alu_name(op0, "nisa.tensor_scalar_reduce op0"),
                           _pvec(operand0, P, "tensor_scalar_reduce", "operand0"), ralu,
                           _reduce_res(reduce_res, P, "tensor_scalar_reduce"), reverse0=bool(reverse0),
                           reduce_init=reduce_init, negate=bool(reduce_res_negate), name=name)


def tensor_partition_reduce(dst, op, data, name=""):
    """``dst[1, F] = op-reduction of data[P, F] over its partitions`` (GpSimd)."""
    require_kernel("nisa.tensor_partition_reduce")
    dst, data = tile(dst, "tensor_partition_reduce", "dst"), tile(data, "tensor_partition_reduce", "data")
    partitions("tensor_partition_reduce", "data", data)
    if dst.shape[0] != 1 or dst.size != math.prod(data.shape[1:]):
        fail(f"tensor_partition_reduce: dst {list(dst.shape)} must be [1, {math.prod(data.shape[1:])}]")
    buffer_in("tensor_partition_reduce data", data, ("sbuf",))
    V.partition_reduce(dst.core(), data.core(), alu_name(op, "nisa.tensor_partition_reduce"), name=name)
