"""Resolution of a view descriptor to a checked core view at instruction time.

* static view: a strided NumPy view of the allocation (bounds checked).
* ``scalar_offset`` (a ``(1, 1)`` SBUF int tile, an ``NkiScalar`` / register, or an int): the
  start moves by ``s * prod(base.shape[indirect_dim + 1:])`` (base = the tensor ``.ap`` was called
  on).
* ``vector_offset`` (``(P, 1)`` SBUF int tile): row ``p`` starts at ``offset + idx[p] * rowsize``
  with ``rowsize = prod(base.shape[1:])``; the leading pattern step is ignored.  The result is a
  core advanced view with its indirect axis on the rows, so ``oob_mode`` is applied by
  :mod:`nki_sim.positions` (skip: the row is not transferred; error: ``IndexError``).
"""

from __future__ import annotations

import numpy as np

from .. import errors as E
from ..access import read_index_tile
from ..tensor import Tensor
from .scalars import NkiScalar
from .tensor import TensorBase as NkiTensor


def scalar_value(x) -> int:
    if isinstance(x, NkiTensor):
        if x.size != 1:
            raise E.IndexingError(f"scalar_offset must be a 1-element tensor; got {list(x.shape)}")
        return int(read_index_tile(x.core()).reshape(-1)[0])
    if isinstance(x, NkiScalar):
        return x.value
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    raise TypeError(f"scalar_offset must be a (1, 1) SBUF tensor, an NkiScalar or an int; got "
                    f"{type(x).__name__}")


def resolve(t: NkiTensor) -> Tensor:
    ind = t._ind
    if ind is None:
        return t._core_static()
    if ind.kind == "scalar":
        s = scalar_value(ind.index)
        off = t.offset + s * ind.dim
        from .views import check_static_bounds
        try:
            check_static_bounds(t, off)
        except E.AccessOutOfBoundError:
            raise E.IndirectIndexError(
                f"scalar_offset {s} moves the access of tensor `{t.name}` out of bounds "
                f"(start element {off}, {t._alloc.data.size} elements)") from None
        return t._core_static(off)
    idx = read_index_tile(ind.index.core()).reshape(-1)
    P = t.shape[0]
    if idx.size != P:
        raise E.IndexingError(f"vector_offset has {idx.size} indices but the access has {P} rows")
    rowsize = int(ind.dim)
    inner = np.full((1,) + t.shape[1:], t.offset, dtype=np.int64)
    for j, (n, s) in enumerate(zip(t.shape[1:], t.strides[1:])):
        sh = [1] * t.ndim
        sh[j + 1] = n
        inner = inner + (np.arange(n, dtype=np.int64) * s).reshape(sh)
    data = t._alloc.data
    col = idx.reshape((P,) + (1,) * (t.ndim - 1))
    if rowsize and data.size % rowsize == 0 and inner.size and inner.min() >= 0 and inner.max() < rowsize:
        arr = data.reshape(data.size // rowsize, rowsize)
        return Tensor(t._alloc, arr, idx=(col, inner), shape=t.shape, indirect=0,
                      lay=(0, (rowsize, 1)))
    flat = data.reshape(-1)
    return Tensor(t._alloc, flat, idx=(col * rowsize + inner,), shape=t.shape, indirect=0, lay=(0, (1,)))

