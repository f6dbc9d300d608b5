"""Shared plumbing of the engine ops: operand reads, destination writes, events, PSUM state.

``PSUM provenance``: every engine write into PSUM records, per element, whether TensorE
(a matmul) wrote it last (:func:`note_psum_write`); ``nc_matmul(accumulate=...)`` consults it
(accumulating onto PSUM written by another instruction is undefined on NeuronCore-v2/v3).
"""

from __future__ import annotations

import weakref

import numpy as np

from .. import errors as E
from ..access import Access, read, write
from .events import Operand, emit_compute, free_size
from ..state import state
from ..tensor import Tensor

_PE_WRITTEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # Alloc -> bool array


def operand(x, name: str, op: str) -> Operand:
    """Checked read of a tile (core view) or a Python / NumPy scalar."""
    if isinstance(x, Tensor):
        v, _ = read(x, op=op)
        return Operand(v, x.arr.dtype, x.shape, x.buffer, x)
    if isinstance(x, (bool, int, float, np.number, np.bool_)):
        from ..dtypes import scalar_dtype
        return Operand(np.asarray(x), scalar_dtype(x), (), "", None)
    raise TypeError(f"operand '{name}' of '{op}' must be a tile or a scalar; got {type(x).__name__}")


def pvec(o: Operand, P: int, name: str, op: str):
    """A per-partition operand (scalar or [P, 1] tile) as fp32, broadcastable to (P, 1)."""
    if o.is_scalar:
        return np.float32(o.v)
    if o.shape[0] not in (1, P) or free_size(o.shape) != 1:
        raise E.NkiCompileError(f"'{op}': {name} must be a scalar or a [{P}, 1] tile; got {list(o.shape)}")
    return np.asarray(o.v, np.float32).reshape(o.shape[0], 1)


def as_rows(v: np.ndarray, P: int) -> np.ndarray:
    return np.asarray(v).reshape(P, -1)


def write_dst(dst: Tensor, values, op: str, mask=None, *, accumulate=False, pe=False) -> Access:
    """Write ``values`` (reshaped to ``dst.shape`` in C order when the counts match) into ``dst``."""
    v = np.asarray(values)
    if v.shape != dst.shape and v.size == dst.size:
        v = v.reshape(dst.shape)
    if mask is not None and mask.shape != dst.shape and mask.size == dst.size:
        mask = mask.reshape(dst.shape)
    acc = write(dst, v, mask, op=op, accumulate=accumulate)
    if dst.buffer == "psum":
        note_psum_write(dst, acc, pe)
    return acc


def note_psum_write(dst: Tensor, acc: Access, pe: bool) -> None:
    flags = _PE_WRITTEN.get(dst.alloc)
    if flags is None:
        if not pe:
            return
        flags = _PE_WRITTEN[dst.alloc] = np.zeros(dst.alloc.data.shape, dtype=bool)
    acc.scatter(flags, pe)


def pe_written(dst: Tensor) -> np.ndarray:
    """Per-element flags of ``dst``: last written by a TensorE matmul."""
    flags = _PE_WRITTEN.get(dst.alloc)
    if flags is None:
        return np.zeros(dst.shape, dtype=bool)
    return np.asarray(Access(dst).gather(flags))


def written_mask(dst: Tensor) -> np.ndarray:
    w = dst.alloc.written
    if w is None:
        return np.ones(dst.shape, dtype=bool)
    return np.asarray(Access(dst).gather(w))


def emit(engine: str, op: str, inputs, dst: Tensor, *, name="", free_elems=None, attrs=None, count=None):
    """The compute event of an instruction writing ``dst`` (fields as the legacy ops record)."""
    if state.traces:
        emit_compute(engine, op, inputs, dst, name=name, free_elems=free_elems, attrs=attrs, count=count)


def accumulators() -> dict:
    """Engine accumulator registers of the running kernel (per partition): ScalarE sums, VectorE max."""
    from ..target import get_target
    k = state.kernel
    acc = k.accumulators
    if acc is None:
        pmax = get_target().pmax
        acc = k.accumulators = {"scalar": np.zeros(pmax, np.float32),
                                "vector": np.full(pmax, -np.inf, np.float32)}
    return acc


def check_partitions(op: str, pname: str, t, limit: int = 128):
    """``<op> <operand> partition dimension N exceeds maximum 128`` (AWS simulator text)."""
    if isinstance(t, Tensor) and t.onchip and t.shape and t.shape[0] > limit:
        raise E.PartitionLimitError(f"{op} {pname} partition dimension {t.shape[0]} exceeds maximum {limit}")
