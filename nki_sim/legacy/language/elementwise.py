"""Element-wise ``nl`` ops: binary ALU ops, unary math, where, copy, broadcast_to.

Shapes follow the legacy rule: a lower-rank tile is left-aligned against its partner
((128,) ~ (128, 1)); NumPy broadcasting otherwise (including partition broadcast
[1, F] + [P, F] for the ``nl`` functions, which operator overloads do not support).
Math: fp32 on Vector/Scalar engines, exact int64 when all inputs are integers and the op
is integer-exact; the result is cast to ``dtype`` (default: NKI promotion of the inputs).
"""

from __future__ import annotations

import numpy as np

from ... import dtypes as D
from ... import errors as E
from ...alu import ALU, apply_act
from ..compute import operand, result_tile, require_kernel
from ...engines.events import tensor_tensor_attrs
from ...state import state
from ...indexing import MaskExpr, broadcast_left, left_shape, mask_array
from ...tensor import Tensor


def _out_shape(op, xs):
    shapes = [x.shape for x in xs if isinstance(x, Tensor)]
    try:
        return tuple(left_shape(shapes)) if shapes else ()
    except ValueError:
        raise E.PartitionMismatchError(
            f"operand shapes {[list(s) for s in shapes]} of '{op}' cannot be broadcast together") from None


def _compute_arrays(ops, name, fn_kind):
    dts = [o.dtype for o in ops]
    int_exact = ALU[name][1] if name in ALU else False
    cdt = D.float32 if not int_exact else D.compute_dtype(dts, int_exact)
    if fn_kind == "bitvec":
        if any(D.is_float(d) for d in dts):
            raise E.DtypeError(f"bitwise '{name}' needs integer operands; got {[d.name for d in dts]}")
        cdt = np.dtype(np.int64)
    rank = max((len(o.shape) for o in ops), default=0)
    vals = []
    for o in ops:
        v = D.as_f32(o.v) if cdt is D.float32 else np.asarray(o.v, dtype=cdt)
        if 0 < v.ndim < rank:
            v = v.reshape(v.shape + (1,) * (rank - v.ndim))
        vals.append(v)
    return vals, cdt


def binary(name, x, y, *, dtype=None, mask=None, op=None, engine=None, operator=False, tname=""):
    opname = op or name
    require_kernel(f"nl.{opname}")
    if operator and isinstance(x, Tensor) and isinstance(y, Tensor) and x.shape and y.shape \
            and x.shape[0] != y.shape[0] and 1 in (x.shape[0], y.shape[0]):
        raise NotImplementedError(
            f"Partition dimension broadcasting is not supported on operator overloads ({list(x.shape)} "
            f"vs {list(y.shape)}); use nl.{name}(...) instead")
    shape = _out_shape(opname, (x, y))
    m = mask_array(mask, shape) if mask is not None else None
    a = operand(x, "x", opname, m)
    b = operand(y, "y", opname, m)
    fn, _, kind = ALU[name]
    (va, vb), cdt = _compute_arrays((a, b), name, kind)
    r = fn(va, vb)
    if dtype is not None:
        out_dt = D.as_dtype(dtype)
    elif kind in ("cmp", "logic"):
        out_dt = D.bool_ if name not in ("logical_and", "logical_or", "logical_xor") else D.bool_
    else:
        out_dt = D.promote(a.dtype, b.dtype)
    if engine is None:       # 32-bit integer add/sub/mul run on GpSimd (which cannot read PSUM)
        engine = "gpsimd" if (cdt == np.int64 and name in ("add", "subtract", "multiply")
                              and "psum" not in (a.buffer, b.buffer)) else "vector"
    isa, inputs, attrs = lowering(name, a, b)
    return result_tile(r, out_dt, op=opname, engine=engine, inputs=inputs, mask=m, shape=shape,
                       name=tname, isa=isa, attrs=attrs)


def lowering(name, a, b):
    """(instruction, its operands in instruction order, event attrs) of ``nl.<name>(x, y)``:
    two tiles of the same elements per partition are a VectorE ``tensor_tensor`` (attr ``nl``); a
    tile with a Python scalar or a ``[P, 1]`` column (broadcast along the free axis) is a
    ``tensor_scalar`` whose engine the compiler picks, its data operand first (as
    ``nisa.tensor_tensor`` / ``nisa.tensor_scalar`` and the current API's ``nl`` ops record them)."""
    if a.t is not None and b.t is not None:
        if a.shape == b.shape:
            return "tensor_tensor", (a, b), _tt_attrs(name, a, b)
        fa, fb = _free(a.shape), _free(b.shape)
        if fa == fb or 1 not in (fa, fb) or not a.shape or not b.shape or a.shape[0] != b.shape[0]:
            return "tensor_tensor", (a, b), _tt_attrs(name, a, b)
        data, opnd = (b, a) if fa == 1 else (a, b)
    else:
        data, opnd = (b, a) if a.t is None else (a, b)
    return "tensor_scalar", (data, opnd), {"ops": (name,), "engine_unspecified": True}


def _tt_attrs(name, a, b):
    return tensor_tensor_attrs(name, (a, b), nl=True) if state.traces else None


def _free(shape):
    n = 1
    for d in shape[1:]:
        n *= d
    return n


def _make_binary(opname, doc):
    def f(x, y, *, dtype=None, mask=None, name="", _operator=False, **kwargs):
        return binary(opname, x, y, dtype=dtype, mask=mask, operator=_operator, tname=name)
    f.__name__ = opname
    f.__qualname__ = opname
    f.__doc__ = doc
    f._alu = opname
    return f


add = _make_binary("add", "x + y")
subtract = _make_binary("subtract", "x - y")
multiply = _make_binary("multiply", "x * y")
divide = _make_binary("divide", "x / y (fp32)")
maximum = _make_binary("maximum", "element-wise max")
minimum = _make_binary("minimum", "element-wise min")
power = _make_binary("power", "x ** y (fp32)")
mod = _make_binary("mod", "x mod y")
fmod = _make_binary("fmod", "C fmod")
equal = _make_binary("equal", "x == y")
not_equal = _make_binary("not_equal", "x != y")
greater = _make_binary("greater", "x > y")
greater_equal = _make_binary("greater_equal", "x >= y")
less = _make_binary("less", "x < y")
less_equal = _make_binary("less_equal", "x <= y")
logical_and = _make_binary("logical_and", "")
logical_or = _make_binary("logical_or", "")
logical_xor = _make_binary("logical_xor", "")
bitwise_and = _make_binary("bitwise_and", "")
bitwise_or = _make_binary("bitwise_or", "")
bitwise_xor = _make_binary("bitwise_xor", "")
left_shift = _make_binary("left_shift", "")
right_shift = _make_binary("right_shift", "")


# ---------------------------------------------------------------------------- unary
_VECTOR_UNARY = {"negative", "abs", "sign", "copy", "identity", "ceil", "floor", "trunc"}


def unary(name, x, *, dtype=None, mask=None, op=None, tname=""):
    opname = op or name
    require_kernel(f"nl.{opname}")
    if not isinstance(x, Tensor):
        raise TypeError(f"nl.{opname}: x must be a tile; got {type(x).__name__}")
    m = mask_array(mask, x.shape) if mask is not None else None
    a = operand(x, "x", opname, m)
    if dtype is not None:
        out_dt = D.as_dtype(dtype)
    elif D.is_int(a.dtype) and name not in ("negative", "abs", "sign", "copy", "identity"):
        out_dt = D.float32
    else:
        out_dt = a.dtype
    if D.is_int(a.dtype) and name in ("negative", "abs", "sign", "copy", "identity"):
        r = ACT_INT[name](a.v.astype(np.int64))
    else:
        r = apply_act(name, a.v)
    engine = "vector" if name in _VECTOR_UNARY else "scalar"
    scalar = engine == "scalar"
    return result_tile(r, out_dt, op=opname, engine=engine, inputs=(a,), mask=m, shape=x.shape,
                       name=tname, isa="activation" if scalar else None,
                       attrs={"func": name} if scalar else None)


ACT_INT = {"negative": np.negative, "abs": np.abs, "sign": np.sign,
           "copy": lambda v: v, "identity": lambda v: v}


def _make_unary(opname, doc=""):
    def f(x, *, dtype=None, mask=None, name="", **kwargs):
        return unary(opname, x, dtype=dtype, mask=mask, tname=name)
    f.__name__ = opname
    f.__qualname__ = opname
    f.__doc__ = doc or f"element-wise {opname} (fp32 math, cast to dtype)"
    f._act = opname
    return f


exp = _make_unary("exp")
log = _make_unary("log")
sqrt = _make_unary("sqrt")
rsqrt = _make_unary("rsqrt")
reciprocal = _make_unary("reciprocal")
tanh = _make_unary("tanh")
sigmoid = _make_unary("sigmoid")
relu = _make_unary("relu")
gelu = _make_unary("gelu")
gelu_apprx_tanh = _make_unary("gelu_apprx_tanh")
gelu_apprx_sigmoid = _make_unary("gelu_apprx_sigmoid", "x * sigmoid(1.702 x) (SDK 2.26)")
silu = _make_unary("silu")
softplus = _make_unary("softplus")
mish = _make_unary("mish")
erf = _make_unary("erf")
sin = _make_unary("sin")
cos = _make_unary("cos")
tan = _make_unary("tan")
arctan = _make_unary("arctan")
abs = _make_unary("abs")   # noqa: A001  (NKI name)
sign = _make_unary("sign")
negative = _make_unary("negative")
square = _make_unary("square")
ceil = _make_unary("ceil")
floor = _make_unary("floor")
trunc = _make_unary("trunc")


def invert(x, *, dtype=None, mask=None, **kwargs):
    """Bitwise NOT (integer tiles)."""
    require_kernel("nl.invert")
    m = mask_array(mask, x.shape) if mask is not None else None
    a = operand(x, "x", "invert", m)
    if D.is_float(a.dtype):
        raise E.DtypeError(f"nl.invert needs an integer tile; got {a.dtype.name}")
    r = ~a.v if a.dtype == D.bool_ else np.invert(a.v)
    return result_tile(r, D.as_dtype(dtype) if dtype else a.dtype, op="invert", engine="vector",
                       inputs=(a,), mask=m, shape=x.shape)


bitwise_not = invert


def logical_not(x, *, dtype=None, mask=None, **kwargs):
    require_kernel("nl.logical_not")
    m = mask_array(mask, x.shape) if mask is not None else None
    a = operand(x, "x", "logical_not", m)
    return result_tile(a.v == 0, D.as_dtype(dtype) if dtype else D.bool_, op="logical_not",
                       engine="vector", inputs=(a,), mask=m, shape=x.shape)


# ---------------------------------------------------------------------------- misc
def _pad(v, rank):
    v = np.asarray(v)
    return v.reshape(v.shape + (1,) * (rank - v.ndim)) if 0 < v.ndim < rank else v


def where(condition, x, y, *, dtype=None, mask=None, name="", **kwargs):
    """``condition ? x : y`` element-wise (nonzero = true); x / y tiles or scalars."""
    require_kernel("nl.where")
    shapes = [v.shape for v in (condition, x, y) if isinstance(v, (Tensor, MaskExpr))]
    try:
        shape = tuple(left_shape(shapes)) if shapes else ()
    except ValueError:
        raise E.PartitionMismatchError(
            f"operand shapes {[list(s) for s in shapes]} of 'where' cannot be broadcast together") from None
    m = mask_array(mask, shape) if mask is not None else None
    cop = None
    if isinstance(condition, MaskExpr):
        c = condition.v
    else:
        cop = operand(condition, "condition", "where", m, allow_scalar=False)
        c = cop.v
    a = operand(x, "x", "where", m)
    b = operand(y, "y", "where", m)
    cdt = np.float32 if (D.is_float(a.dtype) or D.is_float(b.dtype)) else np.int64
    rank = len(shape)
    r = np.where(_pad(c, rank) != 0, _pad(np.asarray(a.v, dtype=cdt), rank),
                 _pad(np.asarray(b.v, dtype=cdt), rank))
    out_dt = D.as_dtype(dtype) if dtype is not None else D.promote(a.dtype, b.dtype)
    return result_tile(r, out_dt, op="where", engine="vector", name=name,
                       inputs=tuple(o for o in (cop, a, b) if o is not None), mask=m, shape=shape)


def copy(src, *, dtype=None, mask=None, name="", **kwargs):
    """Copy a tile into a new SBUF tile (bit-exact when dtype is unchanged)."""
    require_kernel("nl.copy")
    if not isinstance(src, Tensor):
        raise TypeError(f"nl.copy: src must be a tile; got {type(src).__name__}")
    m = mask_array(mask, src.shape) if mask is not None else None
    a = operand(src, "src", "copy", m)
    out_dt = D.as_dtype(dtype) if dtype is not None else a.dtype
    return result_tile(a.v, out_dt, op="copy", engine="vector", inputs=(a,), mask=m, shape=src.shape,
                       name=name, isa="tensor_copy", attrs={"engine_unspecified": True})


copy._act = "copy"


def broadcast_to(src, *, shape, **kwargs):
    """Broadcast a tile to ``shape`` (NumPy rules; partition broadcast runs on TensorE)."""
    require_kernel("nl.broadcast_to")
    shape = tuple(int(s) for s in shape)
    a = operand(src, "src", "broadcast_to")
    try:
        r = np.broadcast_to(a.v, shape)
    except ValueError:
        # tiles align on the partition axis: a (P,) reduction result (keepdims=False) broadcasts
        # to (P, N) (AWS's SD-attention tutorial; nki_sim/README.md rule 6)
        if not (0 < len(a.shape) < len(shape) and tuple(a.shape) == shape[:len(a.shape)]):
            raise ValueError(f"broadcast_to: cannot broadcast tile {list(a.shape)} to "
                             f"{list(shape)}") from None
        r = broadcast_left(np.asarray(a.v), shape)
    engine = "tensor" if (a.shape and a.shape[0] == 1 and shape[0] > 1) else "vector"
    return result_tile(r, a.dtype, op="broadcast_to", engine=engine, inputs=(a,), shape=shape)
