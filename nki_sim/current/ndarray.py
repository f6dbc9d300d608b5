"""``nl.ndarray`` objects: :class:`~nki_sim.current.tensor.TensorBase` descriptors with the view
methods of the current API (implemented in :mod:`nki_sim.current.views`) and resolution to core
views at instruction time (:mod:`nki_sim.current.indirect`)."""

from __future__ import annotations

from .. import errors as E
from ..tensor import Tensor
from . import indirect, views
from .tensor import TensorBase, contiguous_strides


class NkiTensor(TensorBase):
    """A tensor (view) of the current NKI API."""

    __slots__ = ()

    def core(self) -> Tensor:
        """The checked core view of this descriptor (reads index tiles of indirect views)."""
        return indirect.resolve(self)

    # ---- indexing -------------------------------------------------------------------
    def __getitem__(self, key):
        return views.subscript(self, key)

    def __setitem__(self, key, value):
        raise E.NotEmulatedError(
            "assignment into an NKI tensor (t[...] = v) is not part of the current nki API; write "
            "it with an instruction (nisa.tensor_copy(dst=t[...], src=v), nisa.memset, nl.store)")

    def slice(self, dim, start, end, step=1):
        return views.slice_dim(self, dim, start, end, step)

    def select(self, dim, index):
        return views.select(self, dim, index)

    def vector_select(self, dim, index):
        return views.vector_select(self, dim, index)

    def permute(self, *dims):
        return views.permute(self, dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims)

    def broadcast(self, dim, size):
        return views.broadcast(self, dim, size)

    def expand_dim(self, dim):
        return views.expand_dim(self, dim)

    def squeeze_dim(self, dim):
        return views.squeeze_dim(self, dim)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return views.reshape(self, shape)

    def reshape_dim(self, dim, shape):
        return views.reshape_dim(self, dim, shape)

    def flatten_dims(self, start, end):
        return views.flatten_dims(self, start, end)

    def view(self, dtype):
        return views.view_dtype(self, dtype)

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0,
           dtype=None):
        return views.access_pattern(self, pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype)

    def rearrange(self, *a, **k):
        raise E.not_emulated("NkiTensor.rearrange", "compose permute / reshape instead")

    @property
    def T(self):
        raise E.not_emulated("NkiTensor.T", "use nisa.nc_transpose / nisa.dma_transpose")



def wrap_alloc(alloc, dtype_name: str) -> NkiTensor:
    """The whole-allocation view of a core allocation."""
    shape = alloc.data.shape
    return NkiTensor(alloc, shape, contiguous_strides(shape), 0, dtype_name)
