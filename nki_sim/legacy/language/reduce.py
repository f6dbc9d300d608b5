"""``nl`` reductions along the trailing free axes (VectorE): max/min/sum/prod/mean/all/any/var."""

from __future__ import annotations

import builtins
import math

import ml_dtypes
import numpy as np

from ... import dtypes as D
from ... import errors as E
from ...alu import reduce_values
from ..compute import operand, require_kernel, result_tile
from ...indexing import mask_array
from ...tensor import Tensor


def norm_axes(axis, ndim, api):
    """Validate reduction axes: free axes only, the last contiguous ones ([1], [1,2], ...)."""
    if axis is None:
        raise ValueError(f"{api}: axis is required (free axes, e.g. axis=1)")
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(sorted(int(a) % ndim if ndim else int(a) for a in axes))
    if not axes or 0 in axes or axes != tuple(range(ndim - len(axes), ndim)):
        raise E.NkiCompileError(
            f"{api}: reduction axis {axis!r} of a rank-{ndim} tile must be the last contiguous free "
            f"dim(s): [1], [1,2], ... (the partition axis 0 cannot be reduced)")
    return axes


def reduce_op(name, kind, x, axis, dtype=None, mask=None, keepdims=False, negate=False, api=None,
              engine="vector", tname=""):
    api = api or f"nl.{name}"
    require_kernel(api)
    if not isinstance(x, Tensor):
        raise TypeError(f"{api}: x must be a tile; got {type(x).__name__}")
    axes = norm_axes(axis, x.ndim, api)
    m = mask_array(mask, x.shape) if mask is not None else None
    a = operand(x, "x", name, m)
    int_in = D.is_int(a.dtype) or a.dtype == D.bool_
    cdt = np.int64 if (int_in and kind in ("add", "multiply", "maximum", "minimum", "bitwise_and",
                                            "bitwise_or", "bitwise_xor", "logical_and",
                                            "logical_or", "logical_xor")) else np.float32
    v = np.asarray(a.v, dtype=cdt)
    if m is not None:     # masked-out elements do not take part
        ident = {"add": 0, "multiply": 1, "maximum": -np.inf, "minimum": np.inf,
                 "logical_and": 1, "logical_or": 0}.get(kind, 0)
        if cdt == np.int64 and not np.isfinite(ident):
            ident = np.iinfo(np.int64).min if ident < 0 else np.iinfo(np.int64).max
        v = np.where(m, v, np.asarray(ident).astype(cdt))
    if kind == "mean":
        r = np.mean(np.asarray(v, np.float32), axis=axes, keepdims=keepdims, dtype=np.float32)
    elif kind == "var":
        r = np.var(np.asarray(v, np.float32), axis=axes, keepdims=keepdims, dtype=np.float32)
    elif kind == "all":
        r = np.all(v != 0, axis=axes, keepdims=keepdims)
    elif kind == "any":
        r = np.any(v != 0, axis=axes, keepdims=keepdims)
    else:
        r = reduce_values(kind, v, axes, keepdims)
    if negate:
        r = -r
    if dtype is not None:
        out_dt = D.as_dtype(dtype)
    elif kind in ("mean", "var") and int_in:
        out_dt = D.float32
    elif kind in ("all", "any"):
        out_dt = D.bool_
    else:
        out_dt = a.dtype
    out_shape = np.shape(r)
    if len(out_shape) == 0:
        r = np.reshape(r, (1,))
    free = math.prod(x.shape[1:]) if x.ndim > 1 else 1
    out_m = None
    if m is not None:
        out_m = m.any(axis=axes, keepdims=keepdims)
        if out_m.all():
            out_m = None
    isa = "tensor_reduce" if engine == "vector" and kind in _ISA_REDUCE else None
    return result_tile(r, out_dt, op=name, engine=engine, inputs=(a,), mask=out_m, name=tname,
                       free_elems=free, isa=isa)


# reductions that are one VectorE tensor_reduce instruction (nl.sum / max / min / prod / all /
# any, as nisa.tensor_reduce and the current API's nl reductions record them)
_ISA_REDUCE = frozenset({"add", "maximum", "minimum", "multiply", "all", "any"})


def _make(opname, kind, doc):
    def f(x, axis, *, dtype=None, mask=None, keepdims=False, name="", **kwargs):
        return reduce_op(opname, kind, x, axis, dtype=dtype, mask=mask, keepdims=keepdims, tname=name)
    f.__name__ = opname
    f.__qualname__ = opname
    f.__doc__ = doc
    if kind in ("add", "maximum", "minimum", "multiply"):
        f._alu = kind
    return f


max = _make("max", "maximum", "maximum over the trailing free axes")   # noqa: A001
min = _make("min", "minimum", "minimum over the trailing free axes")   # noqa: A001
sum = _make("sum", "add", "sum over the trailing free axes")           # noqa: A001
prod = _make("prod", "multiply", "product over the trailing free axes")
mean = _make("mean", "mean", "mean (fp32 for integer inputs)")
var = _make("var", "var", "variance")
all = _make("all", "all", "logical all")                               # noqa: A001
any = _make("any", "any", "logical any")                               # noqa: A001


# ---------------------------------------------------------------------------- loop_reduce
_LOOP_REDUCE_OPS = ("add", "multiply", "maximum", "minimum")


class LoopReduce:
    """The result of ``nl.loop_reduce(x, op, loop_indices)``: assigned into its accumulator tile,
    ``acc[...] = nl.loop_reduce(x, op=np.add, loop_indices=[k])``, it updates
    ``acc = op(acc, x)`` (the documented equivalent ``nisa.tensor_tensor(data1=acc, data2=x,
    op)``: the destination is also an input). Any other use is an error.

    An accumulator region no earlier instruction wrote starts the reduction: its value is taken
    as the identity of ``op``, so the first iteration stores ``x`` (NKIBench's compiler-generated
    kernels reduce into never-initialised SBUF this way and match NumPy on trn1; nki_sim/README.md,
    "Fidelity to AWS's legacy kernels", rule 7). A region only partly written is an
    ``UninitializedReadError``."""

    __slots__ = ("x", "alu", "dtype", "mask")
    nki_loop_reduce = True

    def __init__(self, x, alu, dtype, mask):
        self.x, self.alu, self.dtype, self.mask = x, alu, dtype, mask

    def assign_into(self, dst: Tensor):
        """``dst = alu(dst, x)`` (masked), recorded as the VectorE ``tensor_tensor`` it is; an
        associative reduction over the loop, so exempt from the ``affine_range`` dependency
        check like ``+=`` (README rule 5)."""
        from ...access import read, write
        from ... import trace
        from .elementwise import binary
        if not dst.onchip:
            raise E.MemorySpaceError(
                f"nl.loop_reduce accumulates into an on-chip tile; {dst.name} is in {dst.buffer}")
        m = mask_array(self.mask, dst.shape) if self.mask is not None else None
        if _starts_reduction(dst, m):
            # the first iteration: the accumulator holds op's identity (exempt like the update)
            write(dst, np.asarray(_identity(self.alu, dst.dtype)), m, op="loop_reduce", exempt=True)
        res = binary(self.alu, dst, self.x, dtype=self.dtype, mask=self.mask, op="loop_reduce")
        vals, _ = read(res, res.pmask, op="loop_reduce")
        write(dst, vals, res.pmask, op="loop_reduce", exempt=True)
        res.fresh = False
        trace.note_write(dst.alloc.id, res.alloc.id, dst.buffer)


def _starts_reduction(dst: Tensor, mask) -> bool:
    """Whether this ``nl.loop_reduce`` starts the reduction of ``dst``'s region: none of the
    elements it reads (``mask``: the masked-in ones) was ever written. False when all were; a
    mix is reported as an uninitialized read (``config.uninitialized`` decides how)."""
    from ...access import uninitialized
    from ...positions import Access
    w = dst.alloc.written
    if w is None:                       # the whole allocation is written
        return False
    written = Access(dst, mask).gather(w)
    read = written if mask is None else written[mask]
    if read.all():                      # also: nothing read (all masked out)
        return False
    if not read.any():
        return True
    uninitialized(dst, written if mask is None else written | ~mask,
                  "nl.loop_reduce into a partly written accumulator (a never-written "
                  "accumulator starts the reduction; a partly written one reads the "
                  "unwritten elements)")
    return False


def _identity(alu: str, dtype) -> object:
    """The identity of ``alu`` in ``dtype`` (for max / min: -/+inf, or the dtype's extreme value
    where it has no infinity, e.g. integers and float8_e4m3fn)."""
    if alu == "add":
        return 0
    if alu == "multiply":
        return 1
    sign = -1 if alu == "maximum" else 1
    if D.is_int(dtype):
        info = np.iinfo(dtype)
        return info.min if sign < 0 else info.max
    if np.isinf(np.float32(sign * np.inf).astype(dtype)):
        return sign * np.inf
    info = ml_dtypes.finfo(dtype)
    return info.min if sign < 0 else info.max


def loop_reduce(x, op, loop_indices, *, dtype=None, mask=None, **kwargs):
    """``nl.loop_reduce``: reduce ``x`` over the loops ``loop_indices`` into the tile the result
    is assigned to (:class:`LoopReduce`). ``op``: add / multiply / maximum / minimum."""
    from ...alu import alu_name
    require_kernel("nl.loop_reduce")
    if not isinstance(x, Tensor):
        raise TypeError(f"nl.loop_reduce: x must be a tile; got {type(x).__name__}")
    alu = alu_name(op, "nl.loop_reduce")
    if alu not in _LOOP_REDUCE_OPS:
        raise NotImplementedError(
            f"nl.loop_reduce(op={alu}): nki_sim emulates the associative reductions "
            f"{', '.join(_LOOP_REDUCE_OPS)}; for another operator write acc[...] = "
            "nisa.tensor_tensor(acc, x, op) in the loop")
    idx = loop_indices if isinstance(loop_indices, (tuple, list)) else (loop_indices,)
    if not idx or not builtins.all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
                                   for i in idx):
        raise ValueError(f"nl.loop_reduce: loop_indices must be a loop index or a non-empty tuple of "
                         f"loop indices (nl.affine_range variables or ints); got {loop_indices!r}")
    return LoopReduce(x, alu, dtype, mask)
