"""Subscript resolution and view methods (reshape, dtype view, expand_dims).

Index forms (API notes §3): ints, slices, ``nl.ds``, ``...`` (basic -> NumPy view);
``nl.arange`` / ``nl.mgrid`` expressions with ints (advanced -> lazily checked gather /
scatter); an on-chip index tile (indirect DMA; only on the partition axis of the access).
Mixing slices with advanced indices is rejected as in NKI.
"""

from __future__ import annotations

import math

import numpy as np

from . import errors as E
from .indexing import IndexExpr, MaskExpr
from .memory import Alloc
from .tensor import Tensor


def _norm_key(t: Tensor, key) -> tuple:
    if type(key) is not tuple:
        key = (key,)
    n_ell = 0
    for k in key:
        if k is Ellipsis:
            n_ell += 1
    if n_ell:
        if n_ell > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        fill = t.ndim - (len(key) - 1)
        key = key[:i] + (slice(None),) * fill + key[i + 1:]
    if len(key) > t.ndim:
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
    return Tensor(t.alloc, arr, pax=max(new_pax, 0), lay=lay)


def _keep_tile_rank(t: Tensor, out: list, new_pax: int) -> None:
    """On-chip views stay tiles (partition + at least one free dimension).

    An int on a free axis drops that axis unless the view would fall below 2-D; then the last
    int-indexed free axis is kept with size 1 (``buf[:, i]`` of a (128, n) tile is (128, 1)),
    the rule the NKI language guide states for on-chip tensors.  AWS's legacy kernels rely
    on it: flash_fwd passes ``l_buffer[:, i]`` to a helper that reads ``[:, 0]``."""
    ints = [ax for ax, k in enumerate(out) if isinstance(k, int) and ax > t.pax]
    if not ints:
        return
    rank = t.ndim - sum(isinstance(k, int) for k in out) - new_pax
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
            comps.append(_access.read_index_tile(k))
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
    return Tensor(t.alloc, t.arr, idx=tuple(comps), shape=shape, indirect=indirect, lay=t._lay)


def _basic_only(t: Tensor, what: str):
    if t.idx is not None:
        raise NotImplementedError(f"{what} of an advanced-indexed view ({t.name}) is not emulated; "
                                  "copy it into a tile first")


def reshape(t: Tensor, shape) -> Tensor:
    _basic_only(t, "reshape")
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != t.size:
        raise ValueError(f"reshape of {t.name}: cannot reshape {list(t.shape)} into {list(shape)}")
    v = t.arr.view()
    try:
        v.shape = shape
    except AttributeError:
        raise ValueError(f"reshape of {t.name} {list(t.shape)} -> {list(shape)} needs a copy "
                         "(non-contiguous view); reshape the whole tensor instead") from None
    isz = v.itemsize
    lay = (t.elem_layout()[0], tuple([s // isz for s in v.strides])) if v.size else None
    return Tensor(t.alloc, v, lay=lay)


def view_dtype(t: Tensor, dtype) -> Tensor:
    """Bit reinterpretation (no copy).  The result aliases the same storage."""
    from .dtypes import as_dtype
    from .access import check_initialized
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
    return Tensor(alias, v)


def expand_dims(t: Tensor, axis) -> Tensor:
    _basic_only(t, "expand_dims")
    return Tensor(t.alloc, np.expand_dims(t.arr, axis))


from . import access as _access  # noqa: E402  (circular: used at call time)
