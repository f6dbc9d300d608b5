"""TensorE ops: matmul into PSUM (overwrite or fp32 accumulate) and PE-array transpose.

``matmul(dst[M, N], stationary[K, M], moving[K, N])``: ``dst (+)= stationary.T @ moving`` with
fp32 products of the stored inputs accumulated in fp32 (operands with more than two dims are
flattened to ``[K, prod(free)]``).  ``transpose(dst[F, P], data[P, F])`` on TensorE or VectorE.
Events match the legacy ``nc_matmul`` / ``nc_transpose`` events (attrs contraction,
stationary_free, moving_free, fp32).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .. import dtypes as D
from ..target import get_target
from ..tensor import Tensor
from .common import emit, operand, write_dst


def _as2d(shape):
    if len(shape) == 2:
        return tuple(shape)
    if len(shape) < 2:
        return tuple(shape) + (1,) * (2 - len(shape))
    return (shape[0], math.prod(shape[1:]))


def _warn_int(op, o):
    if D.is_int(o.dtype) and o.v.size and int(np.abs(np.asarray(o.v, np.int64)).max()) >= 2 ** 24:
        warnings.warn(f"'{op}': integer operand with |values| >= 2^24 goes through fp32 on TensorE; "
                      "hardware results are not exact (the simulator computes exactly)",
                      RuntimeWarning, stacklevel=4)


def matmul_attrs(s_shape, m_shape, fp32: bool) -> dict:
    return {"contraction": s_shape[0], "stationary_free": s_shape[1], "moving_free": m_shape[1],
            "fp32": bool(fp32)}


def matmul(dst: Tensor, stationary: Tensor, moving: Tensor, *, accumulate: bool = False,
           op: str = "nc_matmul", name: str = "") -> None:
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` (fp32)."""
    s_shape, m_shape = _as2d(stationary.shape), _as2d(moving.shape)
    a = operand(stationary, "stationary", op)
    b = operand(moving, "moving", op)
    _warn_int(op, a)
    _warn_int(op, b)
    r = np.matmul(np.asarray(a.v, np.float32).reshape(s_shape).T,
                  np.asarray(b.v, np.float32).reshape(m_shape))
    write_dst(dst, r, op, accumulate=bool(accumulate), pe=True)
    fp32 = stationary.arr.dtype == D.float32 or moving.arr.dtype == D.float32
    emit("tensor", op, (a, b), dst, name=name, free_elems=m_shape[1],
         attrs=matmul_attrs(s_shape, m_shape, fp32))


def pe_transpose_values(vals: np.ndarray) -> np.ndarray:
    """``vals.T`` of a 2-D ``[P, F]`` array as the PE array of the current target returns it.

    NeuronCore-v3 on: bit-accurate. NeuronCore-v2 (trn1): the PE transpose is a matmul of the
    data (stationary) with an identity (moving), and the ``nki.isa.nc_transpose`` reference says
    it "is not bit-accurate if the input data contains NaN/Inf": modeled as that matmul, every
    non-finite element ``vals[p, j]`` contributes ``vals[p, j] * 0 = NaN`` to every other
    element of its output row j, so ``out[j, i]`` is NaN when some ``vals[p, j]``, p != i, is
    NaN or +-Inf, and ``vals[i, j]`` otherwise (an Inf alone in its column stays Inf). Finite
    data moves exactly (bf16 / fp32 values times 1 plus zeros)."""
    out = np.asarray(vals).T
    if get_target().nc_version != "gen2" or not D.is_float(out.dtype):
        return out
    bad = ~np.isfinite(np.asarray(vals, np.float32))            # [P, F]
    if not bad.any():
        return out
    others = bad.sum(axis=0)[:, None] - bad.T                    # [F, P]: non-finite p != i
    out = out.copy()
    out[others > 0] = np.nan
    return out


def transpose(dst: Tensor, data: Tensor, *, engine: str = "tensor", op: str = "nc_transpose",
              name: str = "") -> None:
    """``dst = data.T`` of a 2-D tile (more dims flattened into the free dim)."""
    shape2 = _as2d(data.shape)
    a = operand(data, "data", op)
    if engine == "tensor":
        _warn_int(op, a)
    r = np.asarray(a.v).reshape(shape2)
    r = pe_transpose_values(r) if engine == "tensor" else r.T
    write_dst(dst, r, op, pe=(engine == "tensor"))
    attrs = matmul_attrs(shape2, (shape2[0], shape2[0]), a.dtype == D.float32) if engine == "tensor" else {}
    emit(engine, op, (a,), dst, name=name, free_elems=shape2[0], attrs=attrs)
