"""Shared plumbing of the engine ops: operand reads, destination writes, events, PSUM state.

``Poison propagation``: an element-wise instruction (``operand(..., propagate=True)``) may read a
partly written tile; the destination elements computed from never-written input elements are
left never-written (and poisoned, NaN / integer max) instead of raising, as garbage rows flow on
hardware; reading them later in a non-element-wise way (matmul, DMA, cross-partition) raises.

``PSUM provenance``: every engine write into PSUM records, per element, whether TensorE
(a matmul) wrote it last (:func:`note_psum_write`); ``nc_matmul(accumulate=...)`` consults it
(accumulating onto PSUM written by another instruction is undefined on NeuronCore-v2/v3).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from .. import errors as E
from ..access import Access, read, write
from .events import Operand, emit_compute, free_size
from ..state import state
from ..tensor import Tensor

_PE_WRITTEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # Alloc -> bool array
_PE_LOCK = threading.Lock()


def operand(x, name: str, op: str, propagate: bool = False) -> Operand:
    """Checked read of a tile (core view) or a Python / NumPy scalar (``propagate``: see module)."""
    if isinstance(x, Tensor):
        w = None
        if propagate and x.alloc.written is not None:
            wm = np.asarray(Access(x).gather(x.alloc.written))
            if not wm.all():
                w = np.array(wm, dtype=bool)
        v, _ = read(x, w, op=op)
        return Operand(v, x.arr.dtype, x.shape, x.buffer, x, w)
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


def _input_mask(o: Operand, dst: Tensor, op: str):
    """An input's written mask on the destination grid (same count, or a per-partition operand)."""
    w = o.w
    if w.size == dst.size:
        return w.reshape(dst.shape)
    P = dst.shape[0]
    if w.shape and w.shape[0] == P and free_size(w.shape) == 1:
        return np.broadcast_to(w.reshape((P,) + (1,) * (dst.ndim - 1)), dst.shape)
    if w.shape and w.shape[0] == P:                       # per-row reduction of the input
        return np.broadcast_to(w.reshape(P, -1).all(axis=1).reshape((P,) + (1,) * (dst.ndim - 1)),
                               dst.shape)
    from ..access import uninitialized
    uninitialized(o.t, w, op)
    return None


def write_dst(dst: Tensor, values, op: str, mask=None, *, accumulate=False, pe=False,
              inputs=()) -> Access:
    """Write ``values`` (reshaped to ``dst.shape`` in C order when the counts match) into ``dst``;
    elements computed from never-written ``inputs`` elements become never-written."""
    v = np.asarray(values)
    if v.shape != dst.shape and v.size == dst.size:
        v = v.reshape(dst.shape)
    if mask is not None and mask.shape != dst.shape and mask.size == dst.size:
        mask = mask.reshape(dst.shape)
    garbage = None
    for o in inputs:
        if o is not None and o.w is not None:
            m = _input_mask(o, dst, op)
            if m is not None:
                garbage = ~m if garbage is None else (garbage | ~m)
    if garbage is not None:
        if mask is not None:
            garbage = garbage & mask
            mask = mask & ~garbage
        else:
            mask = ~garbage
    acc = write(dst, v, mask, op=op, accumulate=accumulate)
    if garbage is not None and garbage.any():
        mark_unwritten(dst, garbage)
    if dst.buffer == "psum":
        note_psum_write(dst, acc, pe)
    return acc


def mark_unwritten(dst: Tensor, where: np.ndarray) -> None:
    """Make the ``where`` elements of ``dst`` never-written again (poisoned)."""
    from ..dtypes import poison_value
    alloc = dst.alloc
    if alloc.written is None:
        alloc.written = np.ones(alloc.data.shape, dtype=bool)
        alloc.unwritten = 0
    acc = Access(dst, np.ascontiguousarray(where))
    acc.scatter(alloc.written, False)
    acc.scatter(alloc.data, np.full(dst.shape, poison_value(alloc.data.dtype), dtype=alloc.data.dtype))
    alloc.unwritten = int(alloc.written.size - np.count_nonzero(alloc.written))


def note_psum_write(dst: Tensor, acc: Access, pe: bool) -> None:
    with _PE_LOCK:
        flags = _PE_WRITTEN.get(dst.alloc)
        if flags is None:
            if not pe:
                return
            flags = _PE_WRITTEN[dst.alloc] = np.zeros(dst.alloc.data.shape, dtype=bool)
    acc.scatter(flags, pe)


def pe_written(dst: Tensor) -> np.ndarray:
    """Per-element flags of ``dst``: last written by a TensorE matmul."""
    with _PE_LOCK:
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
