"""VectorE statistics instructions of the legacy API: ``tensor_scalar_reduce``, ``bn_stats``,
``bn_aggr`` (semantics and cost formulas from the legacy ``nki.isa`` reference; fp32 math,
cast on output).

* ``tensor_scalar_reduce(data=, op0=, operand0=, reduce_op=, reduce_res=)``: ``data op0
  operand0`` like a one-operator ``tensor_scalar``, and its reduction over all free axes written
  in place into ``reduce_res`` ((P, 1)); returns the element-wise result. Cost
  ``max(MIN_II, N) + MIN_II``.
* ``bn_stats(data)``: per partition, 6 values: (count, mean, variance * count) of the even and of
  the odd elements of the (at most 512-element, ``nl.tile_size.bn_stats_fmax``) free axis.
* ``bn_aggr(data)``: aggregates (count, mean, variance * count) triples into (mean, variance) per
  partition (population variance).

``mask=`` on ``bn_stats`` / ``bn_aggr`` selects output rows (a row is computed when any of its
input elements is selected); ``tensor_scalar_reduce`` takes no mask here.
"""
from __future__ import annotations

import numpy as np

from ... import dtypes as D
from ... import errors as E
from ...access import write
from ...alu import ALU, alu_name, reduce_values
from ...tensor import Tensor
from ...indexing import mask_array
from ..compute import free_size, operand, require_kernel, result_tile

BN_STATS_FMAX = 512
_REDUCE_OPS = ("add", "subtract", "multiply", "maximum", "minimum")


def _tile(x, api, pname):
    if not isinstance(x, Tensor):
        raise TypeError(f"{api}: {pname} must be a tile; got {type(x).__name__}")
    return x


def _no_mask(mask, api):
    if mask is not None:
        raise NotImplementedError(f"{api}: mask= is not emulated by nki_sim; slice the input tile "
                                  "instead")


def _row_masks(mask, data, width):
    """(input mask, output mask) of a per-partition statistics instruction: an output row is
    written when any element of its input row is selected."""
    if mask is None:
        return None, None
    m = mask_array(mask, data.shape)
    if m is None:
        return None, None
    rows = np.asarray(m).reshape(data.shape[0], -1).any(axis=1)
    return m, np.repeat(rows[:, None], width, axis=1)


def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False,
                         dtype=None, mask=None, name="", **kw):
    """``data <op0> operand0`` on VectorE, reduced over the free axes into ``reduce_res``."""
    api = "nisa.tensor_scalar_reduce"
    require_kernel(api)
    _tile(data, api, "data")
    _no_mask(mask, api)
    n0 = alu_name(op0, f"{api} op0")
    if ALU[n0][2] == "bitvec":
        raise E.NkiCompileError(f"{api}: op0 must be an arithmetic operator; got {n0}")
    rname = alu_name(reduce_op, f"{api} reduce_op")
    if rname not in _REDUCE_OPS:
        raise ValueError(f"{api}: reduce_op must be one of nl.add / subtract / multiply / max / "
                         f"min; got {rname}")
    P = data.shape[0]
    if not isinstance(reduce_res, Tensor) or reduce_res.shape[0] != P or \
            free_size(reduce_res.shape) != 1:
        raise E.NkiCompileError(
            f"{api}: reduce_res must be a tile view of shape ({P}, 1) (one element per "
            f"partition); got {list(getattr(reduce_res, 'shape', [type(reduce_res).__name__]))}")
    a = operand(data, "data", "tensor_scalar_reduce")
    o = operand(operand0, "operand0", "tensor_scalar_reduce")
    if not o.is_scalar and (o.shape[0] not in (1, P) or free_size(o.shape) != 1):
        raise E.NkiCompileError(f"{api}: operand0 must be a scalar or a [{P}, 1] tile; got "
                                f"{list(o.shape)}")
    fn = ALU[n0][0]
    x = np.asarray(a.v, np.float32)
    y = np.asarray(o.v, np.float32)
    if y.ndim:
        y = y.reshape((y.shape[0],) + (1,) * (x.ndim - 1))
    out = fn(y, x) if reverse0 else fn(x, y)
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    res = result_tile(out, out_dt, op="tensor_scalar_reduce", engine="vector", inputs=(a, o),
                      name=name, attrs={"ops": (n0,), "reduce": True})
    red = reduce_values(rname, np.asarray(out, np.float32).reshape(P, -1), 1)
    write(reduce_res, red.reshape((P,) + (1,) * (reduce_res.ndim - 1)) if reduce_res.ndim > 1
          else red, op="tensor_scalar_reduce")
    return res


def bn_stats(data, *, mask=None, dtype=None, name="", **kw):
    """(count, mean, variance * count) of the even and the odd free elements, per partition."""
    api = "nisa.bn_stats"
    require_kernel(api)
    _tile(data, api, "data")
    m_in, m_out = _row_masks(mask, data, 6)
    P, n = data.shape[0], free_size(data.shape)
    if n > BN_STATS_FMAX:
        raise E.SizeLimitError(f"{api}: free size {n} exceeds nl.tile_size.bn_stats_fmax "
                               f"({BN_STATS_FMAX}); call bn_stats per 512 elements and aggregate "
                               "with one bn_aggr")
    a = operand(data, "data", "bn_stats", m_in)
    x = np.asarray(a.v, np.float64).reshape(P, n)
    cols = []
    for half in (x[:, 0::2], x[:, 1::2]):
        c = half.shape[1]
        mean = half.mean(axis=1) if c else np.zeros(P)
        var_c = ((half - mean[:, None]) ** 2).sum(axis=1) if c else np.zeros(P)
        cols += [np.full(P, float(c)), mean, var_c]
    out = np.stack(cols, axis=1).astype(np.float32)
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    return result_tile(out, out_dt, op="bn_stats", engine="vector", inputs=(a,), name=name,
                       shape=(P, 6), free_elems=n, mask=m_out)


def bn_aggr(data, *, mask=None, dtype=None, name="", **kw):
    """(mean, variance) per partition from (count, mean, variance * count) triples."""
    api = "nisa.bn_aggr"
    require_kernel(api)
    _tile(data, api, "data")
    m_in, m_out = _row_masks(mask, data, 2)
    P, n = data.shape[0], free_size(data.shape)
    if n % 3:
        raise ValueError(f"{api}: elements per partition must be a multiple of 3 "
                         f"((count, mean, variance*count) triples); got {n}")
    a = operand(data, "data", "bn_aggr", m_in)
    t = np.asarray(a.v, np.float64).reshape(P, n // 3, 3)
    cnt, mean, var_c = t[..., 0], t[..., 1], t[..., 2]
    total = cnt.sum(axis=1)
    safe = np.where(total > 0, total, 1.0)
    m = (cnt * mean).sum(axis=1) / safe
    var = (var_c.sum(axis=1) + (cnt * (mean - m[:, None]) ** 2).sum(axis=1)) / safe
    out = np.stack([m, var], axis=1).astype(np.float32)
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    return result_tile(out, out_dt, op="bn_aggr", engine="vector", inputs=(a,), name=name,
                       shape=(P, 2), free_elems=n, mask=m_out)
