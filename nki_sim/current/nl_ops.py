"""``nki.language`` convenience wrappers (experimental in AWS's API, reference §4.5).

They allocate their result and call the ISA ops: ``load`` / ``store`` are DMA copies, binary
element-wise ops are VectorE ``tensor_tensor`` (a Python scalar operand: ``tensor_scalar``) and
never broadcast, unary math functions are ScalarE activations, reductions are
``tensor_reduce``, ``matmul`` / ``transpose`` return PSUM tiles.  Every function also names an
ALU / activation operator when passed as ``op=`` to an ISA instruction (``nl.add``, ``nl.exp``).
"""

from __future__ import annotations

import math

import numpy as np

from . import isa_compute as C, isa_dma as M
from .checks import require_kernel, no_broadcast, tile
from .creation import allocate
from .tensor import psum, sbuf
from .ndarray import NkiTensor


def load(src, dtype=None, name=""):
    """A new SBUF tile holding ``src`` (HBM view; dim 0 -> partitions)."""
    require_kernel("nl.load")
    src = tile(src, "load", "src")
    shape = src.shape if src.ndim >= 2 else (src.shape[0], 1)
    out = allocate(shape, dtype or src.dtype, sbuf, name)
    M.dma_copy(out, src, name=name)
    return out


def store(dst, value, name=""):
    require_kernel("nl.store")
    M.dma_copy(tile(dst, "store", "dst"), tile(value, "store", "value"), name=name)


def copy(x, dtype=None, name=""):
    """A ``tensor_copy`` of ``x`` into a new SBUF tile, on the engine the compiler picks (run on
    VectorE; the cost model charges ScalarE, ``nki_sim.cost.assigned_engine``)."""
    require_kernel("nl.copy")
    x = tile(x, "copy", "x")
    out = allocate(x.shape, dtype or x.dtype, sbuf, name)
    C.tensor_copy(out, x, name=name, _nl=True)
    return out


copy._act = "copy"


def _binary(alu):
    def f(x, y, dtype=None, name=""):
        require_kernel(f"nl.{alu}")
        if isinstance(x, NkiTensor) and isinstance(y, NkiTensor):
            no_broadcast(alu, x, y)
            out = allocate(x.shape, dtype or x.dtype, sbuf, name)
            C.tensor_tensor(out, x, y, f, _nl=True)
            return out
        if isinstance(x, NkiTensor):
            out = allocate(x.shape, dtype or x.dtype, sbuf, name)
            C.tensor_scalar(out, x, f, float(y) if not isinstance(y, int) else y)
            return out
        if isinstance(y, NkiTensor):
            out = allocate(y.shape, dtype or y.dtype, sbuf, name)
            C.tensor_scalar(out, y, f, x, reverse0=True)
            return out
        raise TypeError(f"nl.{alu}: at least one operand must be a tensor")
    f.__name__ = f.__qualname__ = alu
    f._alu = alu
    return f


def _unary(act):
    def f(x, dtype=None, name=""):
        require_kernel(f"nl.{act}")
        x = tile(x, act, "x")
        out = allocate(x.shape, dtype or x.dtype, sbuf, name)
        C.activation(out, f, x)
        return out
    f.__name__ = f.__qualname__ = act
    f._act = act
    return f


_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal",
           "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and",
           "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift",
           "right_shift", "abs_max", "mod", "fmod")
_UNARY = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "gelu_apprx_tanh",
          "gelu_apprx_sigmoid", "silu", "softplus", "mish", "erf", "sin", "cos", "tan", "arctan",
          "abs", "sign", "negative", "square", "ceil", "floor", "trunc", "identity")
BINARY = {n: _binary(n) for n in _BINARY}
UNARY = {n: _unary(n) for n in _UNARY}


def reciprocal(x, dtype=None, name=""):
    require_kernel("nl.reciprocal")
    x = tile(x, "reciprocal", "x")
    out = allocate(x.shape, dtype or x.dtype, sbuf, name)
    C.reciprocal(out, x)
    return out


reciprocal._act = "reciprocal"


def _reduce(alu):
    def f(x, axis, dtype=None, keepdims=False, name=""):
        require_kernel(f"nl.{f.__name__}")
        x = tile(x, f.__name__, "x")
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        keep = [n for d, n in enumerate(x.shape) if d not in {a % x.ndim for a in axes}]
        shape = tuple(keep) if len(keep) >= 2 else (x.shape[0], 1)
        if keepdims:
            shape = tuple(1 if d in {a % x.ndim for a in axes} else n for d, n in enumerate(x.shape))
        out = allocate(shape, dtype or x.dtype, sbuf, name)
        C.tensor_reduce(out, BINARY[alu], x, axes)
        return out
    return f


sum_ = _reduce("add")
max_ = _reduce("maximum")
min_ = _reduce("minimum")
sum_.__name__, max_.__name__, min_.__name__ = "sum", "max", "min"


def matmul(x, y, transpose_x=False, name=""):
    """``x.T @ y`` into a new fp32 PSUM tile (requires ``transpose_x=True``)."""
    require_kernel("nl.matmul")
    if not transpose_x:
        raise AssertionError("nl.matmul requires transpose_x=True (x is the stationary [K, M] operand)")
    x, y = tile(x, "matmul", "x"), tile(y, "matmul", "y")
    out = allocate((math.prod(x.shape[1:]), math.prod(y.shape[1:])), "float32", psum, name)
    C.nc_matmul(out, x, y, accumulate=False)
    return out


def transpose(x, name=""):
    """``x.T`` into a new PSUM tile of ``x``'s dtype (TensorE)."""
    require_kernel("nl.transpose")
    x = tile(x, "transpose", "x")
    out = allocate((math.prod(x.shape[1:]), x.shape[0]), x.dtype, psum, name)
    C.nc_transpose(out, x)
    return out


def where(cond, x, y, dtype=None, name=""):
    raise NotImplementedError("nl.where is not emulated by nki_sim's current front end; use "
                              "nisa.tensor_copy_predicated or nisa.select_reduce")


def device_print(prefix, t):
    """Print a tensor's values (the one API whose job is to print)."""
    from ..access import read_values
    v = read_values(t.core(), op="device_print") if isinstance(t, NkiTensor) else t
    print(prefix, np.asarray(v))


def ds(start, size):
    """``nl.ds(start, size)``: the slice ``start : start + size``."""
    return slice(start, start + size)
