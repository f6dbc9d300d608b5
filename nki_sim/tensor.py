"""The core tensor type: a view of an :class:`~nki_sim.memory.Alloc`, its subscripts and views.

* basic view: ``arr`` is a NumPy view into ``alloc.data`` (ints / slices / ``nl.ds``);
  ``idx is None``.
* advanced view: ``arr`` is the (basic) parent view and ``idx`` a tuple, one entry per axis
  of ``arr``, of int64 arrays (broadcastable) or ints; bounds are checked when the access
  executes (so ``mask=`` can exclude out-of-range elements).  ``indirect`` is the axis that
  holds a runtime index tile (indirect DMA), else None.

Shapes: HBM tensors follow NumPy (an int drops its axis).  On-chip tensors keep the
partition axis (an int there keeps size 1); ints on free axes drop them, but an on-chip view
stays at least 2-D (see :func:`_keep_tile_rank`).

Index forms (API notes §3): ints, slices, ``nl.ds``, ``...`` (basic -> NumPy view);
``nl.arange`` / ``nl.mgrid`` expressions with ints (advanced -> lazily checked gather /
scatter); an on-chip index tile (indirect DMA; only on the partition axis of the access).
Mixing slices with advanced indices is rejected as in NKI.

:class:`Tensor` holds storage / view metadata and checked access only (reads and writes with
checks live in :mod:`nki_sim.access`).  It has no arithmetic operators and no assignment: a
front end subclasses it with its own semantics (the legacy ``neuronxcc.nki`` tensor is
:class:`nki_sim.legacy.tensor.LegacyTensor`).  Every view keeps the class of its parent
(``type(t)(...)``), so each front end gets its own tensor type from the same core; the class
of a launch's tensors is ``KernelContext.tensor_type``.
"""

from __future__ import annotations

import math

import numpy as np

from . import errors as E
from .access import check_initialized, read_index_tile
from .dtypes import as_dtype
from .indexing import IndexExpr, MaskExpr
from .memory import HBM_BUFFERS, ONCHIP, Alloc


class Tensor:
    __slots__ = ("alloc", "arr", "idx", "shape", "indirect", "pax", "_lay", "__weakref__")

    def __init__(self, alloc, arr, idx=None, shape=None, indirect=None, pax=0, lay=None):
        self.alloc = alloc
        self.arr = arr
        self.idx = idx
        self.shape = arr.shape if shape is None else tuple(shape)
        self.indirect = indirect
        self.pax = pax          # partition axis of this view (0 unless block dims)
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
        return np.ndarray(arr.shape, aux.dtype, aux, off * a, tuple([s * a for s in es]))

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
        return subscript(self, key)

    # ---- view methods ------------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return reshape(self, shape)

    def view(self, dtype):
        return view_dtype(self, dtype)

    def expand_dims(self, axis):
        return expand_dims(self, axis)

    def assert_shape(self, shape):
        if tuple(shape) != self.shape:
            raise AssertionError(f"tensor {self.name} has shape {self.shape}; expected {tuple(shape)}")
        return self


def is_tensor(x) -> bool:
    return isinstance(x, Tensor)


def is_index(x) -> bool:
    return isinstance(x, (IndexExpr, MaskExpr))


# ---------------------------------------------------------------------------- subscripts
def _norm_key(t: Tensor, key) -> tuple:
    if type(key) is not tuple:
        key = (key,)
    nd = len(t.shape)
    for i, k in enumerate(key):       # identity tests only: tiles overload ==
        if k is Ellipsis:
            if any(k2 is Ellipsis for k2 in key[i + 1:]):
                raise IndexError("an index can only have a single ellipsis ('...')")
            key = key[:i] + (slice(None),) * (nd - (len(key) - 1)) + key[i + 1:]
            break
    if len(key) > nd:
        raise IndexError(f"too many indices for tensor {t.name} of shape {list(t.shape)}: got {len(key)}")
    return key


def _oob(t, axis, lo, hi, size):
    return E.AccessOutOfBoundError(
        f"Out-of-bound access for tensor `{t.name}` on dimension {axis}: index range "
        f"[{lo}, {hi}] exceed dimension size of {size}")


_BASIC = (slice, int)          # exact types of the common basic subscripts


def subscript(t: Tensor, key) -> Tensor:
    if t.idx is not None:
        raise NotImplementedError(
            f"indexing an advanced-indexed view of {t.name} is not emulated; index the tensor once")
    key = _norm_key(t, key)
    for k in key:
        if type(k) not in _BASIC:
            break
    else:
        return _basic(t, key)
    advanced = any(isinstance(k, (IndexExpr, Tensor, np.ndarray)) for k in key)
    if any(isinstance(k, MaskExpr) for k in key):
        raise TypeError("a mask expression cannot be used as an index; pass it as mask=")
    if not advanced:
        return _basic(t, key)
    return _advanced(t, key)


def _basic(t: Tensor, key) -> Tensor:
    onchip = t.onchip
    out: list = []
    pax = t.pax
    new_pax = pax
    shape = t.shape
    off, es = t.elem_layout()
    for ax, k in enumerate(key):
        n = shape[ax]
        if type(k) is slice or isinstance(k, slice):
            start, stop, step = k.start, k.stop, k.step
            if step is None and (stop is None or type(stop) is int) and (start is None or type(start) is int):
                # the common case (``:``, ``a:b``, ``nl.ds``): the checks below, without the loop
                if stop is not None and stop > n:
                    raise _oob(t, ax, 0 if start is None else (start if start >= 0 else start + n),
                               stop - 1, n)
                if start:
                    if start > n or start < -n:
                        raise _oob(t, ax, start, start, n)
                    off += (start if start >= 0 else start + n) * es[ax]
                out.append(k)
                continue
            for v in (start, stop, step):
                if v is not None and not isinstance(v, (int, np.integer)):
                    raise TypeError(f"slice bounds must be ints (loop variables); got {type(v).__name__}")
            if (step is None or step > 0) and stop is not None and stop > n:
                lo = 0 if start is None else (start if start >= 0 else start + n)
                raise _oob(t, ax, lo, stop - 1, n)
            if start is not None and (start > n or start < -n) and (step is None or step > 0):
                raise _oob(t, ax, start, start, n)
            if start or (step is not None and step < 0):
                off += k.indices(n)[0] * es[ax]
            out.append(k)
        elif isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            k = int(k)
            if not -n <= k < n:
                raise _oob(t, ax, k, k, n)
            k = k % n                            # normalise negative ints (Python convention)
            off += k * es[ax]
            if onchip and ax == pax:
                out.append(slice(k, k + 1))
            else:
                out.append(k)
                if ax < pax:
                    new_pax -= 1
        elif k is None:
            raise IndexError("None / np.newaxis is not a valid NKI index; use .expand_dims")
        else:
            raise TypeError(f"unsupported index {k!r} of type {type(k).__name__} for tensor {t.name}")
    if onchip:
        _keep_tile_rank(t, out, new_pax)
    new_es = [es[ax] * (k.step or 1) for ax, k in enumerate(out) if type(k) is slice]
    new_es.extend(es[len(out):])            # axes not subscripted
    arr = t.arr[tuple(out)]
    if arr.ndim == 0:               # HBM scalar element: keep as a (1,) view
        arr = t.arr[tuple(slice(k, k + 1) if isinstance(k, int) else k for k in out)].reshape(1)
        isz = arr.itemsize
        new_es = [s // isz for s in arr.strides]
    lay = (off, tuple(new_es)) if arr.size else None
    return type(t)(t.alloc, arr, pax=max(new_pax, 0), lay=lay)


def _keep_tile_rank(t: Tensor, out: list, new_pax: int) -> None:
    """On-chip views stay tiles (partition + at least one free dimension).

    An int on a free axis drops that axis unless the view would fall below 2-D; then the last
    int-indexed free axis is kept with size 1 (``buf[:, i]`` of a (128, n) tile is (128, 1)),
    the rule the NKI language guide states for on-chip tensors.  AWS's legacy kernels rely
    on it: flash_fwd passes ``l_buffer[:, i]`` to a helper that reads ``[:, 0]``."""
    ints = [ax for ax, k in enumerate(out) if isinstance(k, int) and ax > t.pax]
    if not ints:
        return
    rank = len(t.shape) - sum(isinstance(k, int) for k in out) - new_pax
    if rank < 2:
        ax = ints[-1]
        out[ax] = slice(out[ax], out[ax] + 1)


def _advanced(t: Tensor, key) -> Tensor:
    if len(key) < t.ndim:
        raise E.IndexingError(
            f"tensor {t.name} of rank {t.ndim} indexed with {len(key)} indices mixing basic and "
            "advanced indexing (missing trailing axes); index every axis with nl.arange "
            "(err_unsupported_mixing_basic_advanced_tensor_indexing)")
    if any(isinstance(k, slice) for k in key):
        raise E.IndexingError(
            f"Unsupported mixing of basic tensor indexing and advanced tensor indexing on tensor "
            f"{t.name}: slices / nl.ds cannot be combined with nl.arange / index tensors; use "
            "nl.arange for every axis (err_unsupported_mixing_basic_advanced_tensor_indexing)")
    comps, indirect = [], None
    for ax, k in enumerate(key):
        if isinstance(k, IndexExpr):
            if k.ndim == 1 and len(key) > 1:
                raise E.IndexingError(
                    f"1-D nl.arange used to index axis {ax} of {t.name}; lift it to 2-D with "
                    "[:, None] or [None, :] (err_1d_arange_not_supported)", code="err_1d_arange_not_supported")
            comps.append(k.v)
        elif isinstance(k, Tensor):
            if indirect is not None:
                raise NotImplementedError("more than one indirect index tensor in one access is not emulated")
            if not t.is_hbm:
                raise E.IndexingError(
                    f"dynamic (indirect) index into on-chip tensor {t.name}: indirect indices are only "
                    "supported on the HBM side of nl.load / nl.store / nisa.dma_copy "
                    "(err_copy_dynamic_indirect_indices_not_natively_supported)",
                    code="err_copy_dynamic_indirect_indices_not_natively_supported")
            comps.append(read_index_tile(k))
            indirect = ax
        elif isinstance(k, np.ndarray):
            if k.dtype.kind not in "iu":
                raise TypeError(f"index arrays must be integer; got {k.dtype}")
            comps.append(k.astype(np.int64))
        elif isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            k = int(k)
            n = t.shape[ax]
            if not -n <= k < n:
                raise _oob(t, ax, k, k, n)
            comps.append(k % n)
        else:
            raise TypeError(f"unsupported index {k!r} of type {type(k).__name__} for tensor {t.name}")
    arrays = [c for c in comps if isinstance(c, np.ndarray)]
    rank = max(a.ndim for a in arrays)
    if indirect is not None:   # index tiles are left-aligned like tiles: (P,) ~ (P, 1)
        c = comps[indirect]
        if c.ndim < rank:
            comps[indirect] = c = c.reshape(c.shape + (1,) * (rank - c.ndim))
    try:
        shape = np.broadcast_shapes(*[c.shape for c in comps if isinstance(c, np.ndarray)])
    except ValueError:
        raise IndexError(f"index arrays for {t.name} cannot be broadcast together: "
                         f"{[c.shape for c in comps if isinstance(c, np.ndarray)]}") from None
    if indirect is not None:
        c = comps[indirect]
        cs = (1,) * (len(shape) - c.ndim) + c.shape
        if any(s != 1 for s in cs[1:]):
            raise E.IndexingError(
                f"Dynamic indexing for load/store only supports the indirect indexing to be on the "
                f"partition or block dimension; index tile of shape {list(c.shape)} varies along a "
                f"free dimension of the access {list(shape)} (err_indirect_indices_free_dim)",
                code="err_indirect_indices_free_dim")
    return type(t)(t.alloc, t.arr, idx=tuple(comps), shape=shape, indirect=indirect, lay=t._lay)


def _basic_only(t: Tensor, what: str):
    if t.idx is not None:
        raise NotImplementedError(f"{what} of an advanced-indexed view ({t.name}) is not emulated; "
                                  "copy it into a tile first")


def reshape(t: Tensor, shape) -> Tensor:
    _basic_only(t, "reshape")
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != t.size:
        raise ValueError(f"reshape of {t.name}: cannot reshape {list(t.shape)} into {list(shape)}")
    v = t.arr.reshape(shape)
    if v.size and not np.may_share_memory(v, t.arr):      # NumPy had to copy: not a view
        raise ValueError(f"reshape of {t.name} {list(t.shape)} -> {list(shape)} needs a copy "
                         "(non-contiguous view); reshape the whole tensor instead")
    isz = v.itemsize
    lay = (t.elem_layout()[0], tuple([s // isz for s in v.strides])) if v.size else None
    return type(t)(t.alloc, v, lay=lay)


def view_dtype(t: Tensor, dtype) -> Tensor:
    """Bit reinterpretation (no copy).  The result aliases the same storage."""
    _basic_only(t, "view")
    d = as_dtype(dtype, "view dtype")
    if d == t.dtype:
        return t
    check_initialized(t, None, "view")
    t.alloc.poison()                 # the alias exposes the whole allocation
    base = t.alloc.data
    try:
        alias_data = base.view(d)
        v = t.arr.view(d)
    except ValueError as e:
        raise ValueError(f"view of {t.name} as {d.name}: {e}") from None
    alias = Alloc(alias_data, t.alloc.buffer, name=t.alloc.name, kind=t.alloc.kind, written=True,
                  mutable=t.alloc.mutable, count_live=False)
    alias.birth_epoch = t.alloc.birth_epoch
    alias.rec = t.alloc.rec             # one storage, one lifetime
    return type(t)(alias, v)


def expand_dims(t: Tensor, axis) -> Tensor:
    _basic_only(t, "expand_dims")
    return type(t)(t.alloc, np.expand_dims(t.arr, axis))
