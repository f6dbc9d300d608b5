"""Composite ``nl`` ops: softmax, gather_flattened."""

from __future__ import annotations

import numpy as np

from ... import dtypes as D
from ..compute import operand, require_kernel, result_tile
from ...indexing import mask_array
from ...tensor import Tensor
from .reduce import norm_axes


def softmax(x, axis, *, dtype=None, compute_dtype=None, mask=None, **kwargs):
    """``exp(x - max(x)) / sum(exp(x - max(x)))`` along the trailing free axes (fp32)."""
    require_kernel("nl.softmax")
    if not isinstance(x, Tensor):
        raise TypeError(f"nl.softmax: x must be a tile; got {type(x).__name__}")
    axes = norm_axes(axis, x.ndim, "nl.softmax")
    m = mask_array(mask, x.shape) if mask is not None else None
    a = operand(x, "x", "softmax", m)
    v = np.asarray(a.v, np.float32)
    e = np.exp(v - v.max(axis=axes, keepdims=True))
    r = e / e.sum(axis=axes, keepdims=True, dtype=np.float32)
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    return result_tile(r, out_dt, op="softmax", engine="scalar", inputs=(a,), mask=m)


def gather_flattened(data, indices, *, dtype=None, mask=None, **kwargs):
    """Per partition: ``out[p, j] = data[p].ravel()[indices[p].ravel()[j]]`` (out-of-range
    indices give poisoned, never-written elements, as hardware gives garbage)."""
    require_kernel("nl.gather_flattened")
    if not isinstance(data, Tensor) or not isinstance(indices, Tensor):
        raise TypeError("nl.gather_flattened: data and indices must be tiles")
    if indices.dtype.kind not in "iu":
        raise TypeError(f"nl.gather_flattened: indices must be integer; got {indices.dtype.name}")
    P = data.shape[0]
    if indices.shape[0] != P:
        raise ValueError(f"nl.gather_flattened: indices must have {P} partitions; got {list(indices.shape)}")
    d = operand(data, "data", "gather_flattened")
    ix = operand(indices, "indices", "gather_flattened")
    flat = np.asarray(d.v).reshape(P, -1)
    idx = np.asarray(ix.v, np.int64).reshape(P, -1)
    ok = (idx >= 0) & (idx < flat.shape[1])
    r = np.take_along_axis(flat, np.where(ok, idx, 0), axis=1)
    m = ok.reshape(indices.shape)
    if mask is not None:
        m = m & mask_array(mask, indices.shape)
    out_dt = D.as_dtype(dtype) if dtype is not None else d.dtype
    return result_tile(r.reshape(indices.shape), out_dt, op="gather_flattened", engine="gpsimd",
                       inputs=(d, ix), mask=None if m.all() else m)
