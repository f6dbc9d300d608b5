"""``nl.ndarray`` of the current API: a view ``(storage, offset, shape, strides, dtype)``.

A view of shape ``[n0..nk]`` addresses ``flat[offset + sum(strides[j] * i_j)]`` of its
allocation's storage (C order, element units).  Every view method (``[]``, ``slice``,
``select``, ``permute``, ``broadcast``, ``reshape``, ``view(dtype)``, ``ap``) makes a new
descriptor and costs nothing; a view is resolved to a checked core view
(:class:`nki_sim.tensor.Tensor`) only when an instruction executes (:meth:`NkiTensor.core`),
so indirect views (``.ap(vector_offset=...)`` / ``scalar_offset=...``) read their index tiles at
that moment.  Dim 0 of an on-chip (SBUF / PSUM) view is the partition dim.
"""

from __future__ import annotations

import math

import numpy as np

from .. import errors as E
from ..memory import HBM_BUFFERS
from ..tensor import Tensor



class MemoryRegion:
    """``nl.sbuf`` / ``nl.psum`` / ``nl.hbm`` (= ``nl.private_hbm``) / ``nl.shared_hbm``."""

    __slots__ = ("name", "core")

    def __init__(self, name, core):
        self.name, self.core = name, core

    def __repr__(self):
        return f"nl.{self.name}"

    def __eq__(self, other):
        if isinstance(other, MemoryRegion):
            return _CANON[self.core] == _CANON[other.core]
        return NotImplemented

    def __hash__(self):
        return hash(_CANON[self.core])


_CANON = {"sbuf": "sbuf", "psum": "psum", "hbm": "private_hbm", "private_hbm": "private_hbm",
          "shared_hbm": "shared_hbm"}
sbuf = MemoryRegion("sbuf", "sbuf")
psum = MemoryRegion("psum", "psum")
hbm = MemoryRegion("hbm", "hbm")
private_hbm = MemoryRegion("private_hbm", "private_hbm")
shared_hbm = MemoryRegion("shared_hbm", "shared_hbm")
REGIONS = {r.core: r for r in (sbuf, psum, hbm, private_hbm, shared_hbm)}


def strided(data: np.ndarray, offset: int, shape, strides) -> np.ndarray:
    """NumPy view of C-contiguous ``data`` at element ``offset`` with element ``strides``."""
    isz = data.itemsize
    if math.prod(shape) == 0:
        return data.reshape(-1)[:0]
    return np.ndarray(tuple(shape), data.dtype, buffer=data, offset=offset * isz,
                      strides=tuple(s * isz for s in strides))


def oob_error(name, dim, lo, hi, n):
    return E.AccessOutOfBoundError(
        f"Out-of-bound access for tensor `{name}` on dimension {dim}: index range [{lo}, {hi}] "
        f"exceed dimension size of {n}.")


class Indirect:
    """A pending indirection of an ``.ap`` view: the index is read when an op uses the view."""

    __slots__ = ("kind", "index", "dim", "base_shape")

    def __init__(self, kind, index, dim, base_shape):
        self.kind, self.index, self.dim, self.base_shape = kind, index, dim, tuple(base_shape)


class TensorBase:
    """The descriptor of a tensor (view) of the current NKI API (view methods:
    :class:`nki_sim.current.ndarray.NkiTensor`).  ``dtype`` is an NKI dtype string."""

    __slots__ = ("_alloc", "shape", "strides", "offset", "_dt", "_ind", "_cc", "__weakref__")
    __array_ufunc__ = None

    def __init__(self, alloc, shape, strides, offset, dtype, ind=None):
        self._alloc = alloc
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        self._dt = dtype
        self._ind = ind
        self._cc = None           # cached core view of a static descriptor

    # ---- metadata ----------------------------------------------------------------
    @property
    def dtype(self) -> str:
        return self._dt

    @property
    def buffer(self) -> MemoryRegion:
        return REGIONS[self._alloc.buffer]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def name(self) -> str:
        return self._alloc.name

    @property
    def onchip(self) -> bool:
        return self._alloc.buffer in ("sbuf", "psum")

    def __repr__(self):
        return f"<nki ndarray {self.name} {self.buffer!r} {list(self.shape)} {self._dt}>"

    def __len__(self):
        return self.shape[0]

    def __bool__(self):
        raise TypeError("the truth value of an NKI tensor is undefined; use nl.if_else / "
                        "nisa.scalar_load for runtime conditions")

    def __iter__(self):
        raise TypeError("NKI tensors are not iterable; slice them")

    __hash__ = object.__hash__

    def _new(self, shape, strides, offset, dtype=None, ind=None, alloc=None):
        return type(self)(alloc or self._alloc, shape, strides, offset, dtype or self._dt, ind)

    def _static(self, what):
        if self._ind is not None:
            raise E.IndexingError(f"{what} of indirect view of tensor `{self.name}`: an indirect "
                                  "view cannot be re-indirected, sliced or reshaped (is_indirect())")

    def _core_static(self, offset=None) -> Tensor:
        if offset is None and self._cc is not None:
            return self._cc
        off = self.offset if offset is None else offset
        arr = strided(self._alloc.data, off, self.shape or (1,), self.strides or (1,))
        t = Tensor(self._alloc, arr, lay=(off, self.strides or (1,)) if arr.size else None)
        if offset is None:
            self._cc = t
        return t

    def get_pattern(self):
        return [[s, n] for s, n in zip(self.strides, self.shape)]

    def is_contiguous(self) -> bool:
        exp = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != exp:
                return False
            exp *= n
        return True

    def is_indirect(self) -> bool:
        return self._ind is not None

    # ---- no operators: the current nl ops are functions -----------------------------
    def _no_op(self, *a):
        raise TypeError("arithmetic operators on NKI tensors are not part of the current nki API; "
                        "use nl.add / nl.multiply ... or nisa.tensor_tensor / tensor_scalar")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _no_op
    __rtruediv__ = __pow__ = __neg__ = __lt__ = __le__ = __gt__ = __ge__ = _no_op
    __and__ = __or__ = __xor__ = __iadd__ = __imul__ = __isub__ = _no_op


def is_hbm(t: TensorBase) -> bool:
    return t._alloc.buffer in HBM_BUFFERS


def contiguous_strides(shape) -> tuple:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))
