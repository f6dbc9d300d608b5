"""The NKI tensor object: a view of an :class:`~nki_sim.memory.Alloc`.

* basic view: ``arr`` is a NumPy view into ``alloc.data`` (ints / slices / ``nl.ds``);
  ``idx is None``.
* advanced view: ``arr`` is the (basic) parent view and ``idx`` a tuple, one entry per axis
  of ``arr``, of int64 arrays (broadcastable) or ints; bounds are checked when the access
  executes (so ``mask=`` can exclude out-of-range elements).  ``indirect`` is the axis that
  holds a runtime index tile (indirect DMA), else None.

Shapes: HBM tensors follow NumPy (an int drops its axis).  On-chip tensors keep the
partition axis (an int there keeps size 1); ints on free axes drop them.  Reads and writes
with checks live in :mod:`nki_sim.access`; operators delegate to ``nki_sim.language``.
"""

from __future__ import annotations

import math

import numpy as np

from .indexing import IndexExpr, MaskExpr
from .memory import HBM_BUFFERS, ONCHIP


class Tensor:
    __slots__ = ("alloc", "arr", "idx", "shape", "indirect", "fresh", "pmask", "pax", "producer", "_lay",
                 "__weakref__")
    __array_priority__ = 100
    __array_ufunc__ = None      # NumPy scalars / ufuncs defer to the NKI operators

    def __init__(self, alloc, arr, idx=None, shape=None, indirect=None, pax=0, lay=None):
        self.alloc = alloc
        self.arr = arr
        self.idx = idx
        self.shape = arr.shape if shape is None else tuple(shape)
        self.indirect = indirect
        self.fresh = False      # result of an op not yet assigned anywhere
        self.pmask = None       # bool mask of the elements the producing op wrote
        self.pax = pax          # partition axis of this view (0 unless block dims)
        self.producer = None    # (engine, op) of the instruction that produced a fresh tile
        self._lay = lay         # (element offset, element strides) of arr in alloc.data, if known

    # ---- metadata -------------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        return self.arr.dtype

    @property
    def buffer(self) -> str:
        return self.alloc.buffer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.arr.dtype.itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def name(self) -> str:
        return self.alloc.name

    @property
    def onchip(self) -> bool:
        return self.alloc.buffer in ONCHIP

    @property
    def is_hbm(self) -> bool:
        return self.alloc.buffer in HBM_BUFFERS

    def __repr__(self):
        kind = "advanced " if self.idx is not None else ""
        return f"<nki_sim {kind}tensor {self.name} {self.buffer} {self.shape} {self.dtype.name}>"

    def __len__(self):
        return self.shape[0]

    def __bool__(self):
        raise ValueError("Cannot evaluate truth value of a multi-element tensor/array "
                         "(err_ambiguous_tensor_truth_value)")

    def __iter__(self):
        raise TypeError("NKI tensors are not iterable; index them with nl.arange / slices")

    __hash__ = object.__hash__

    # ---- offsets relative to the allocation -----------------------------------------
    def elem_layout(self):
        """(element offset, element strides) of the basic view ``arr`` inside ``alloc.data``."""
        lay = self._lay
        if lay is None:
            base = self.alloc.data
            isz = base.dtype.itemsize
            if self.arr is base:
                ptr = 0
            else:
                ptr = self.arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]
            lay = self._lay = (ptr // isz, tuple([s // isz for s in self.arr.strides]))
        return lay

    def aux_view(self, aux: np.ndarray) -> np.ndarray:
        """The view of ``aux`` (same shape as ``alloc.data``) matching the basic view ``arr``."""
        arr = self.arr
        if arr is self.alloc.data:
            return aux
        off, es = self.elem_layout()
        a = aux.itemsize
        if arr.size == 0:
            return aux.reshape(-1)[:0].reshape(self.arr.shape)
        return np.ndarray(self.arr.shape, aux.dtype, aux, off * a, tuple(s * a for s in es))

    def flat_offsets(self) -> np.ndarray:
        """Element offsets into ``alloc.data`` of every element of a basic view (int64, shape)."""
        off, es = self.elem_layout()
        out = np.full(self.arr.shape, off, dtype=np.int64)
        for ax, (n, s) in enumerate(zip(self.arr.shape, es)):
            if n > 1 and s:
                sh = [1] * self.arr.ndim
                sh[ax] = n
                out = out + (np.arange(n, dtype=np.int64) * s).reshape(sh)
        return out

    # ---- indexing ----------------------------------------------------------------------
    def __getitem__(self, key):
        return _views.subscript(self, key)

    def __setitem__(self, key, value):
        _access.assign(self, key, value)

    # ---- view methods ------------------------------------------------------------------
    def reshape(self, *shape):
        from .views import reshape
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return reshape(self, shape)

    def view(self, dtype):
        from .views import view_dtype
        return view_dtype(self, dtype)

    def astype(self, dtype):
        from .legacy.language import copy
        return copy(self, dtype=dtype)

    def broadcast_to(self, shape):
        from .legacy.language.elementwise import broadcast_to
        return broadcast_to(self, shape=tuple(shape))

    def expand_dims(self, axis):
        from .views import expand_dims
        return expand_dims(self, axis)

    def assert_shape(self, shape):
        if tuple(shape) != self.shape:
            raise AssertionError(f"tensor {self.name} has shape {self.shape}; expected {tuple(shape)}")
        return self

    @property
    def T(self):
        from .legacy.language import transpose
        return transpose(self)

    # ---- operators (Vector engine element-wise ops) -------------------------------------
    def _op(name, reverse=False):
        def f(self, other):
            fn = getattr(_lang("elementwise"), name)    # operators exist in every SDK
            return fn(other, self, _operator=True) if reverse else fn(self, other, _operator=True)
        f.__name__ = name
        return f

    __add__ = _op("add"); __radd__ = _op("add", True)
    __sub__ = _op("subtract"); __rsub__ = _op("subtract", True)
    __mul__ = _op("multiply"); __rmul__ = _op("multiply", True)
    __truediv__ = _op("divide"); __rtruediv__ = _op("divide", True)
    __pow__ = _op("power"); __rpow__ = _op("power", True)
    __mod__ = _op("mod"); __rmod__ = _op("mod", True)
    __lt__ = _op("less"); __le__ = _op("less_equal")
    __gt__ = _op("greater"); __ge__ = _op("greater_equal")
    __eq__ = _op("equal"); __ne__ = _op("not_equal")
    __and__ = _op("bitwise_and"); __rand__ = _op("bitwise_and", True)
    __or__ = _op("bitwise_or"); __ror__ = _op("bitwise_or", True)
    __xor__ = _op("bitwise_xor"); __rxor__ = _op("bitwise_xor", True)
    __lshift__ = _op("left_shift"); __rshift__ = _op("right_shift")
    del _op

    def __neg__(self):
        from .legacy import language as nl
        return nl.negative(self)

    def __invert__(self):
        from .legacy import language as nl
        return nl.invert(self)

    def __abs__(self):
        from .legacy import language as nl
        return nl.abs(self)

    def _inplace(self, other, fname):
        return _access.inplace_update(self, other, fname)

    def __iadd__(self, other): return self._inplace(other, "add")
    def __isub__(self, other): return self._inplace(other, "subtract")
    def __imul__(self, other): return self._inplace(other, "multiply")
    def __itruediv__(self, other): return self._inplace(other, "divide")


_LANG: dict = {}


def _lang(name):
    """``nki_sim.language.<name>`` (imported on first use: the language package imports this module)."""
    m = _LANG.get(name)
    if m is None:
        import importlib
        m = _LANG[name] = importlib.import_module(f"{__package__}.legacy.language.{name}")
    return m


def is_tensor(x) -> bool:
    return isinstance(x, Tensor)


def is_index(x) -> bool:
    return isinstance(x, (IndexExpr, MaskExpr))


from . import access as _access, views as _views  # noqa: E402  (circular: used at call time)
