"""TensorE ops of ``nl``: matmul and transpose, plus the shared matmul core used by nisa.

``matmul(x, y, transpose_x)`` computes ``x.T @ y`` (transpose_x=True) or ``x @ y``:
contraction K on the partition axis (<= 128), stationary free M <= 128, moving free N <= 512.
Products of the (cast) inputs are accumulated in fp32 into an fp32 PSUM tile; ``psum += ...``
accumulates (see nki_sim.access.inplace_update).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ... import dtypes as D
from ... import errors as E
from ..compute import operand, require_kernel, result_tile
from ...indexing import mask_array
from ...state import state
from ...target import get_target
from ...tensor import Tensor
from ...engines.tensor_engine import pe_transpose_values


def _limit(op, pname, shape, dim, limit):
    if shape[dim] > limit:
        raise E.SizeLimitError(
            f"size of dimension {dim} in '{pname}{list(shape)}' of '{op}' exceed architecture "
            f"limitation of {limit}")


def _warn_int_precision(op, o):
    """TensorE passes data through fp32: integers >= 2^24 are not exact on hardware."""
    if D.is_int(o.dtype) and o.v.size and int(np.abs(np.asarray(o.v, np.int64)).max()) >= 2**24:
        warnings.warn(f"'{op}': integer operand with |values| >= 2^24 goes through fp32 on TensorE; "
                      "hardware results are not exact (the simulator computes exactly)",
                      RuntimeWarning, stacklevel=4)


def _as2d(t: Tensor, op, pname):
    shape = t.shape
    if len(shape) == 2:
        return shape
    if t.ndim < 2:
        return t.shape + (1,) * (2 - t.ndim)
    return (t.shape[0], math.prod(t.shape[1:]))


def _operand_mask(m, axis, shape, shape2d):
    """Elements of a matmul operand (``shape``, read as ``shape2d`` [K, F]) that the unmasked
    outputs read: column f of the operand for every output along the other axis (``axis``
    reduced away: 1 for the stationary's M rows, 0 for the moving's N columns); None = all."""
    if m is None:
        return None
    cols = m.any(axis=axis)
    return np.broadcast_to(cols[None, :], shape2d).reshape(tuple(shape))


def matmul_core(op, stationary, moving, *, mask=None, out_dtype=D.float32, sname="stationary",
                mname="moving", fresh="pe", name=""):
    """out[M, N] = stationary[K, M].T @ moving[K, N] in fp32 (PSUM tile)."""
    tgt = get_target()
    for pname, t in ((sname, stationary), (mname, moving)):
        if not isinstance(t, Tensor):
            raise TypeError(f"'{op}': {pname} must be an SBUF tile; got {type(t).__name__}")
    s_shape = _as2d(stationary, op, sname)
    m_shape = _as2d(moving, op, mname)
    _limit(op, sname, s_shape, 0, tgt.gemm_contraction_max)
    _limit(op, mname, m_shape, 0, tgt.gemm_contraction_max)
    _limit(op, sname, s_shape, 1, tgt.gemm_stationary_fmax)
    _limit(op, mname, m_shape, 1, tgt.gemm_moving_fmax)
    if s_shape[0] != m_shape[0]:
        raise E.PartitionMismatchError(
            f"number of partitions (dimension 0 size of a tile) mismatch in parameters "
            f"({sname}{list(stationary.shape)}, {mname}{list(moving.shape)}) of '{op}' "
            "(the contraction dimension K must match)")
    f32 = (stationary.arr.dtype == D.float32, moving.arr.dtype == D.float32)
    if f32[0] != f32[1] and not (D.is_int(stationary.dtype) or D.is_int(moving.dtype)):
        raise E.DtypeError(
            f"'{op}': if one matmul operand is float32 the other must be too; got "
            f"{stationary.dtype.name} and {moving.dtype.name}")
    out_shape = (s_shape[1], m_shape[1])
    m = mask_array(mask, out_shape) if mask is not None else None
    # a masked-off output row / column reads no stationary column / moving column (any K)
    a = operand(stationary, sname, op, _operand_mask(m, 1, stationary.shape, s_shape), require_sbuf=True)
    b = operand(moving, mname, op, _operand_mask(m, 0, moving.shape, m_shape), require_sbuf=True)
    _warn_int_precision(op, a)
    _warn_int_precision(op, b)
    sa = D.as_f32(a.v).reshape(s_shape)
    mb = D.as_f32(b.v).reshape(m_shape)
    r = np.matmul(sa.T, mb)
    return result_tile(r, out_dtype, op=op, engine="tensor", inputs=(a, b), mask=m,
                       buffer="psum", fresh=fresh, free_elems=m_shape[1], name=name,
                       attrs={"contraction": s_shape[0], "stationary_free": s_shape[1],
                              "moving_free": m_shape[1], "fp32": bool(any(f32))})


def matmul(x, y, *, transpose_x=False, mask=None, name="", **kwargs):
    """``x.T @ y`` if transpose_x else ``x @ y``; fp32 result in PSUM."""
    require_kernel("nl.matmul")
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise TypeError("nl.matmul: x and y must be SBUF tiles")
    if transpose_x:
        return matmul_core("matmul", x, y, mask=mask, sname="x", mname="y", name=name)
    # x is [M, K]: the compiler transposes it on TensorE first (stationary = x.T)
    if x.ndim != 2:
        raise ValueError(f"nl.matmul: x must be 2-D; got shape {list(x.shape)}")
    tgt = get_target()
    _limit("matmul", "x", x.shape, 0, tgt.gemm_stationary_fmax)
    _limit("matmul", "x", x.shape, 1, tgt.gemm_contraction_max)
    if x.shape[1] != y.shape[0]:
        raise E.PartitionMismatchError(
            f"nl.matmul: contraction mismatch x{list(x.shape)} @ y{list(y.shape)}")
    xt = transpose(x)
    xt.fresh = False
    return matmul_core("matmul", xt, y, mask=mask, sname="x", mname="y", name=name)


def transpose_core(op, x, *, dtype=None, mask=None, engine="tensor", buffer="sbuf", name=""):
    tgt = get_target()
    if not isinstance(x, Tensor):
        raise TypeError(f"'{op}': x must be a tile; got {type(x).__name__}")
    shape2 = _as2d(x, op, "x")
    edge = tgt.transpose_max if engine == "tensor" else tgt.vector_transpose_max
    _limit(op, "x", shape2, 0, edge)
    _limit(op, "x", shape2, 1, edge)
    out_shape = (shape2[1], shape2[0])
    m = mask_array(mask, out_shape) if mask is not None else None
    a = operand(x, "x", op, None, require_sbuf=(engine == "tensor"))
    if engine == "tensor":
        _warn_int_precision(op, a)
    if state.implied:      # partially written input: the transposed elements stay unwritten
        _, pm = state.implied.pop()
        pt = pm.reshape(shape2).T
        m = pt if m is None else (m & pt)
    r = np.asarray(a.v).reshape(shape2)
    r = pe_transpose_values(r) if engine == "tensor" else r.T
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    attrs = {}
    if engine == "tensor":
        attrs = {"contraction": shape2[0], "stationary_free": shape2[1],
                 "moving_free": shape2[0], "fp32": a.dtype == D.float32}
    res = result_tile(r, out_dt, op=op, engine=engine, inputs=(a,), mask=m, buffer=buffer,
                      free_elems=out_shape[1], attrs=attrs, name=name)
    res.producer = (engine, op, a.dtype)       # source dtype: PSUM dtype rule of PE transposes
    return res


def transpose(x, *, dtype=None, mask=None, name="", **kwargs):
    """2-D transpose (each dim <= 128) on TensorE."""
    require_kernel("nl.transpose")
    if isinstance(x, Tensor) and x.ndim > 2:
        raise E.NkiCompileError(
            f"nl.transpose supports 2-D tiles only; got shape {list(x.shape)} "
            "(err_exceed_max_supported_dimension)", code="err_exceed_max_supported_dimension")
    return transpose_core("transpose", x, dtype=dtype, mask=mask, name=name)
