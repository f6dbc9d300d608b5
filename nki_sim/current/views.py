"""View methods of :class:`~nki_sim.current.ndarray.NkiTensor` (all zero-cost descriptors).

Indexing rules (NKI language guide, "Tensor Indexing"): on chip an int on dim 0 keeps it at
size 1 and an int on a free dim drops it unless the view would fall below 2-D (then the last
int-indexed free dim stays at size 1); on HBM an int drops its dim.  ``.ap(pattern, offset)``
addresses the allocation's flat storage and ignores the view it is called on; on chip its first
pair is the partition access, whose step must be the storage's free size.
"""

from __future__ import annotations

import math

import numpy as np

from .. import errors as E
from ..memory import Alloc
from . import dtypes as T
from .tensor import Indirect, TensorBase, oob_error, contiguous_strides


def _norm_key(t, key):
    if type(key) is not tuple:
        key = (key,)
    if any(k is Ellipsis for k in key):
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (t.ndim - len(key) + 1) + key[i + 1:]
    if len(key) > t.ndim:
        raise IndexError(f"too many indices for tensor `{t.name}` of shape {list(t.shape)}: got {len(key)}")
    return key + (slice(None),) * (t.ndim - len(key))


def _int(v, what):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int (a Python value known at trace time); got {type(v).__name__}")
    return int(v)


def subscript(t, key):
    t._static("indexing")
    key = _norm_key(t, key)
    shape, strides, off = [], [], t.offset
    ints = []                       # output positions of int-indexed free dims (on chip)
    dyn = None
    for d, k in enumerate(key):
        n, s = t.shape[d], t.strides[d]
        if isinstance(k, slice):
            start, stop, step = (None if v is None else _int(v, "slice bound") for v in (k.start, k.stop, k.step))
            if step is not None and step == 0:
                raise ValueError("slice step cannot be zero")
            if (step is None or step > 0) and stop is not None and stop > n:
                lo = 0 if start is None else (start if start >= 0 else start + n)
                raise oob_error(t.name, d, lo, stop - 1, n)
            if start is not None and (start >= n > 0 or start < -n) and (step is None or step > 0) \
                    and not (stop is not None and stop <= start):
                raise oob_error(t.name, d, start, start, n)
            a, b, c = slice(start, stop, step).indices(n)
            cnt = len(range(a, b, c))
            off += a * s
            shape.append(cnt)
            strides.append(s * c)
        elif isinstance(k, TensorBase):
            if dyn is not None:
                raise E.NotEmulatedError("more than one dynamic index in one subscript is not emulated")
            dyn = (k, s)
            if t.onchip and d == 0:
                shape.append(1)
                strides.append(s)
            elif not t.onchip:
                pass
            else:
                ints.append(len(shape))
                shape.append(1)
                strides.append(s)
        else:
            i = _int(k, f"index of dim {d}")
            if not -n <= i < n:
                raise oob_error(t.name, d, i, i, n)
            i %= n
            off += i * s
            if t.onchip:
                if d != 0:
                    ints.append(len(shape))
                shape.append(1)
                strides.append(s)
            # HBM: the dim is dropped
    if t.onchip and ints:
        keep = ints[-1] if len(shape) - len(ints) < 2 else None
        drop = [p for p in ints if p != keep]
        shape = [n for i, n in enumerate(shape) if i not in drop]
        strides = [s for i, s in enumerate(strides) if i not in drop]
    if not shape:
        shape, strides = [1], [1]
    out = t._new(shape, strides, off)
    if dyn is not None:
        out._ind = Indirect("scalar", dyn[0], dyn[1], ())
    return out


def slice_dim(t, dim, start, end, step=1):
    key = [slice(None)] * t.ndim
    key[dim] = slice(start, end, step)
    return subscript(t, tuple(key))


def select(t, dim, index):
    key = [slice(None)] * t.ndim
    key[dim] = index
    return subscript(t, tuple(key))


def vector_select(t, dim, index):
    """``t.vector_select(0, idx)``: row ``p`` of the view is row ``idx[p]`` of ``t`` (HBM only)."""
    if dim != 0:
        raise E.IndexingError(f"vector_select: only dim 0 can be indexed by a vector; got dim {dim}")
    pattern = [[t.strides[0], index.shape[0]]] + [[s, n] for s, n in zip(t.strides[1:], t.shape[1:])]
    return access_pattern(t, pattern, t.offset, None, index, 0, None, _rowsize=t.strides[0])


def permute(t, dims):
    t._static("permute")
    dims = tuple(int(d) for d in dims)
    if sorted(dims) != list(range(t.ndim)):
        raise ValueError(f"permute: {list(dims)} is not a permutation of the {t.ndim} dims of `{t.name}`")
    if t.onchip and dims[0] != 0:
        raise E.IndexingError(f"permute of on-chip tensor `{t.name}`: dim 0 (the partition dim) must "
                              f"stay first; got {list(dims)}")
    return t._new([t.shape[d] for d in dims], [t.strides[d] for d in dims], t.offset)


def broadcast(t, dim, size):
    t._static("broadcast")
    if t.shape[dim] != 1:
        raise ValueError(f"broadcast: dim {dim} of `{t.name}` has size {t.shape[dim]}; only size-1 "
                         "dims can be broadcast")
    if t.onchip and dim == 0:
        raise E.IndexingError(f"broadcast of on-chip tensor `{t.name}` along dim 0 (partitions) is "
                              "not supported; copy across partitions instead")
    shape, strides = list(t.shape), list(t.strides)
    shape[dim], strides[dim] = int(size), 0
    return t._new(shape, strides, t.offset)


def expand_dim(t, dim):
    t._static("expand_dim")
    dim = dim % (t.ndim + 1)
    if t.onchip and dim == 0:
        raise E.IndexingError(f"expand_dim(0) of on-chip tensor `{t.name}` would move the partition dim")
    shape, strides = list(t.shape), list(t.strides)
    shape.insert(dim, 1)
    strides.insert(dim, 0)
    return t._new(shape, strides, t.offset)


def squeeze_dim(t, dim):
    t._static("squeeze_dim")
    if t.shape[dim] != 1:
        raise ValueError(f"squeeze_dim: dim {dim} of `{t.name}` has size {t.shape[dim]}, not 1")
    if t.onchip and (dim == 0 or t.ndim <= 2):
        raise E.IndexingError(f"squeeze_dim({dim}) of on-chip tensor `{t.name}` {list(t.shape)}: "
                              "SBUF and PSUM tensors must have at least 2 dimensions (partition-dim "
                              "and free-dim)")
    return t._new(t.shape[:dim] + t.shape[dim + 1:], t.strides[:dim] + t.strides[dim + 1:], t.offset)


def _merge_strides(shape, strides, new_shape, name):
    """Element strides of ``new_shape`` for a reshape of a strided view without a copy (NumPy's
    rule, probed on a zero-size-buffer view), else ValueError."""
    probe = np.lib.stride_tricks.as_strided(np.zeros(1), shape=tuple(shape),
                                            strides=tuple(8 * s for s in strides))
    try:
        r = np.reshape(probe, tuple(new_shape), copy=False)
    except ValueError:
        raise ValueError(f"reshape of `{name}` {list(shape)} -> {list(new_shape)} needs a copy "
                         "(the view is not contiguous across the merged dims)") from None
    return [s // 8 for s in r.strides]


def reshape(t, shape):
    t._static("reshape")
    shape = tuple(_int(s, "reshape size") for s in shape)
    if math.prod(shape) != t.size:
        raise AssertionError(f"reshape of `{t.name}` must keep the element count: {list(t.shape)} "
                             f"({t.size}) -> {list(shape)} ({math.prod(shape)})")
    if t.onchip and shape[0] != t.shape[0]:
        raise E.IndexingError(f"reshape of on-chip tensor `{t.name}` must keep dim 0 (partitions): "
                              f"{list(t.shape)} -> {list(shape)}")
    if t.is_contiguous():
        strides = contiguous_strides(shape)
    else:
        strides = _merge_strides(t.shape, t.strides, shape, t.name)
    return t._new(shape, strides, t.offset)


def reshape_dim(t, dim, shape):
    return reshape(t, t.shape[:dim] + tuple(shape) + t.shape[dim + 1:])


def flatten_dims(t, start, end):
    n = math.prod(t.shape[start:end + 1])
    return reshape(t, t.shape[:start] + (n,) + t.shape[end + 1:])


# ---------------------------------------------------------------------------- dtype views
def alias_alloc(alloc: Alloc, dtype_name: str) -> Alloc:
    """An allocation aliasing ``alloc``'s storage as another dtype (flat, no copy).  Same-size
    dtypes share the written bitmap (uninitialised reads stay detected); other sizes poison the
    never-written elements and stop tracking them (see nki_sim/README.md)."""
    d = T.to_np(dtype_name)
    if d == alloc.data.dtype:
        return alloc
    if not T.precise():
        raise E.NotEmulatedError("dtype views (.view / .ap(dtype=)) under NKI_PRECISE_FP=0 are not "
                                 "emulated: narrow floats are stored as fp32 there")
    flat = alloc.data.reshape(-1)
    if (flat.size * flat.itemsize) % d.itemsize:
        raise ValueError(f"view of `{alloc.name}` as {dtype_name}: {flat.size * flat.itemsize} bytes "
                         f"are not a multiple of {d.itemsize}")
    data = flat.view(d)
    if d.itemsize == flat.itemsize and alloc.written is not None:
        written = alloc.written.reshape(-1)
    else:
        alloc.poison()
        alloc.written = None
        alloc.lazy_poison = False
        written = True
    alias = Alloc(data, alloc.buffer, name=alloc.name, kind=alloc.kind, written=written,
                  mutable=alloc.mutable, count_live=False)
    if written is not True:
        alias.written = written          # the same array object (shared bitmap)
        alias.unwritten = int(np.count_nonzero(~written))
    alias.birth_epoch = alloc.birth_epoch
    alias.rec = alloc.rec               # one storage, one lifetime
    alias.user_array = alloc.user_array
    alias.ever_written = alloc.ever_written
    return alias


def view_dtype(t, dtype):
    """Reinterpret the bits; the last dim is rescaled by the itemsize ratio."""
    t._static("view")
    name = T.name_of(dtype)
    old, new = T.itemsize(t.dtype), T.itemsize(name)
    if old == new:
        return t._new(t.shape, t.strides, t.offset, name, alloc=alias_alloc(t._alloc, name))
    if t.strides[-1] != 1 and t.shape[-1] != 1:
        raise ValueError(f"view of `{t.name}` as {name} needs a contiguous last dim (stride 1)")
    nbytes_last = t.shape[-1] * old
    if nbytes_last % new or (t.offset * old) % new or any((s * old) % new for s in t.strides[:-1]):
        raise ValueError(f"view of `{t.name}` {list(t.shape)} {t.dtype} as {name}: the last dim and "
                         "the offsets must be whole multiples of the new element size")
    shape = t.shape[:-1] + (nbytes_last // new,)
    strides = tuple(s * old // new for s in t.strides[:-1]) + (1,)
    return t._new(shape, strides, t.offset * old // new, name, alloc=alias_alloc(t._alloc, name))


# ---------------------------------------------------------------------------- access patterns
def access_pattern(t, pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype,
                   _rowsize=None):
    """``t.ap(pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype)`` (see module doc)."""
    t._static(".ap")
    try:
        pairs = [(_int(p[0], ".ap step"), _int(p[1], ".ap count")) for p in pattern]
    except (TypeError, IndexError):
        raise ValueError(f".ap pattern must be a list of [step, count] pairs; got {pattern!r}") from None
    if not pairs:
        raise ValueError(".ap pattern must have at least one [step, count] pair")
    alloc, name = t._alloc, t.dtype
    scale_num, scale_den = 1, 1
    if dtype is not None and T.name_of(dtype) != t.dtype:
        name = T.name_of(dtype)
        alloc = alias_alloc(t._alloc, name)
        scale_num, scale_den = T.itemsize(t.dtype), T.itemsize(name)
    off = t.offset * scale_num // scale_den if offset is None else _int(offset, ".ap offset")
    if t.onchip:
        if len(pairs) < 2:
            raise E.IndexingError(f".ap of on-chip tensor `{t.name}`: SBUF and PSUM tensors must have "
                                  "at least 2 dimensions (partition-dim and free-dim)")
        free = alloc.data.size // alloc.data.shape[0] if alloc.data.ndim > 1 else 1
        if pairs[0][1] > 1 and pairs[0][0] != free:
            raise E.IndexingError(
                f".ap of on-chip tensor `{t.name}`: the partition step (first pair) must equal the "
                f"free size of the tensor ({free} elements), got {pairs[0][0]}; partitions are "
                "accessed contiguously, strided partitions are illegal")
    shape = [n for _, n in pairs]
    strides = [s for s, _ in pairs]
    out = t._new(shape, strides, off, name, alloc=alloc)
    if vector_offset is not None and scalar_offset is not None:
        raise ValueError(".ap: vector_offset and scalar_offset are mutually exclusive")
    if vector_offset is not None:
        from .checks import check_vector_offset
        check_vector_offset(t, vector_offset, indirect_dim)
        base = t.shape if _rowsize is None else None
        rowsize = _rowsize if _rowsize is not None else math.prod(base[1:]) * scale_num // scale_den
        out._ind = Indirect("vector", vector_offset, rowsize, t.shape)
    elif scalar_offset is not None:
        d = _int(indirect_dim, ".ap indirect_dim")
        mult = math.prod(t.shape[d + 1:]) * scale_num // scale_den
        out._ind = Indirect("scalar", scalar_offset, mult, t.shape)
    else:
        check_static_bounds(out)
    return out


def check_static_bounds(t, offset=None):
    """The elements a static view addresses lie inside its allocation."""
    if t.size == 0:
        return
    off = t.offset if offset is None else offset
    lo = off + sum(s * (n - 1) for s, n in zip(t.strides, t.shape) if s < 0)
    hi = off + sum(s * (n - 1) for s, n in zip(t.strides, t.shape) if s > 0)
    size = t._alloc.data.size
    if lo < 0 or hi >= size:
        raise E.AccessOutOfBoundError(
            f"Out-of-bound access for tensor `{t.name}`: access pattern {t.get_pattern()} with "
            f"offset {off} addresses elements [{lo}, {hi}] of its {size} elements.")
