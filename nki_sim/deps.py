"""The ``affine_range`` loop-carried dependency checker.

Every read and write, inside an ``affine_range`` iteration, of a tensor created before that
iteration is logged with the current epoch (``state.epoch``, advanced at every iteration
start).  An element of an access conflicts when the latest epoch logged on it -- by writes,
for a read; by writes and by reads, for a write -- lies in ``[loop start, iteration start)``
of an enclosing affine loop: another iteration touched it (``OutputDependencyError``).

The log of an allocation (:class:`EpochLog`, one for writes and one for reads) keeps accesses
symbolic while it can: a basic view is a box in the allocation's index space, and a new access
is first compared with the boxes logged inside the epoch windows.  Only when one of them
overlaps it, or an access is not a box (strided / reshaped views, masks are kept exact,
index arrays), are the pending accesses replayed, in epoch order, into a per-element epoch
array -- exactly the stamps an eager checker holds -- and the access is checked element by
element.  Tiles that are only read inside a loop (the common case) are never replayed.
"""

from __future__ import annotations

import bisect
import linecache
import re

import numpy as np

from . import errors as E
from .config import config

_MAX_PENDING = 48          # replay the log beyond this many symbolic entries
_max, _min = np.maximum.reduce, np.minimum.reduce


class EpochLog:
    """Epochs of the accesses of one kind (writes or reads) logged on one allocation.

    ``arr``: per-element latest epoch of the replayed accesses (int32, -1 = never), or None;
    ``arr_max``: the largest epoch in ``arr``.  ``pending``: accesses not replayed yet, in
    epoch order (a dict keyed by the region: logging an unmasked region again moves it to the
    end with its new epoch), each ``(epoch, off, strides, shape, offs, valid)`` -- a basic view
    by element layout (``strides`` None: the whole allocation), or flat element offsets
    ``offs``; ``boxes``: the boxes of pending regions, computed when a check needs them.
    Entries hold no tensor references (no cycles through the allocation, whose lifetime
    drives the live-bytes accounting).
    """

    __slots__ = ("arr", "pending", "arr_max", "boxes")

    def __init__(self):
        self.arr = None
        self.pending = {}
        self.arr_max = -1
        self.boxes = {}

    def replay(self, shape) -> np.ndarray:
        """Scatter the pending accesses into ``arr`` (allocated for ``shape`` on first use)."""
        arr = self.arr
        if arr is None:
            arr = self.arr = np.full(shape, -1, dtype=np.int32)
        if self.pending:
            flat = arr.reshape(-1)
            last = -1
            for e, off, es, vshape, offs, valid in self.pending.values():
                last = e
                if offs is None:
                    if es is None:
                        view = arr
                    else:
                        if not all(vshape):
                            continue
                        view = np.ndarray(vshape, np.int32, arr, off * 4, tuple([s * 4 for s in es]))
                    if valid is None:
                        view[...] = e
                    else:
                        np.copyto(view, e, where=valid)
                elif valid is None:
                    flat[offs] = e
                else:
                    flat[offs[valid]] = e
            self.arr_max = max(self.arr_max, last)
            self.pending = {}
            self.boxes = {}
        return arr


# ---------------------------------------------------------------------------- boxes
def layout_box(data, off, es, shape):
    """The box ``((lo, hi), ...)`` (inclusive, one pair per axis of ``data``) covered by the
    view with element offset ``off``, element strides ``es`` and ``shape`` inside the
    C-contiguous array ``data`` (``es`` None: all of it), or None when it is not a box
    (steps, reshaped strides) or is empty."""
    dims = data.shape
    if es is None:
        return tuple([(0, n - 1) for n in dims])
    if not all(shape):
        return None
    isz = data.itemsize
    nat = tuple([s // isz for s in data.strides])
    rem = off
    if es == nat:                   # unit-step slices of every axis (the common case)
        b = []
        for s, n, nk in zip(nat, shape, dims):
            q, rem = divmod(rem, s) if s else (0, rem)
            if q + n > nk:
                return None
            b.append((q, q + n - 1))
        return tuple(b) if rem == 0 else None
    lo = []
    for s in nat:
        q, rem = divmod(rem, s) if s else (0, rem)
        lo.append(q)
    if rem:
        return None
    hi = list(lo)
    used = set()
    for n, s in zip(shape, es):
        if n == 1:
            continue
        for k, (nk, sk) in enumerate(zip(dims, nat)):
            if sk == s and nk > 1 and k not in used:
                used.add(k)
                hi[k] = lo[k] + n - 1
                if hi[k] >= nk:
                    return None
                break
        else:
            return None
    return tuple(zip(lo, hi))


def _entry_box(log, key, entry, data):
    b = log.boxes.get(key, False)
    if b is False:
        _e, off, es, shape, offs, _valid = entry
        b = log.boxes[key] = None if offs is not None else layout_box(data, off, es, shape)
    return b


def _overlap(a, b) -> bool:
    for (alo, ahi), (blo, bhi) in zip(a, b):
        if alo > bhi or blo > ahi:
            return False
    return True


# ---------------------------------------------------------------------------- checks
def frames_for(alloc, k):
    """Enclosing affine_range frames whose current iteration started after ``alloc`` was born
    (outermost first), or None.  ``k`` is the running kernel."""
    aff = k.affine
    if not aff or not config.check_dependencies:
        return None
    born = alloc.birth_epoch
    if born < aff[0].iter_start:
        return aff
    fr = [f for f in aff if born < f.iter_start]
    return fr or None


def _in_window(e, frames) -> bool:
    for f in frames:
        if f.loop_start <= e < f.iter_start:
            return True
    return False


def _region(t, acc):
    """(dedup key, entry without epoch) of access ``acc`` of view ``t``."""
    if acc.offs is not None:
        return None, (0, None, None, acc.offs, acc.valid)
    if t.arr is t.alloc.data:
        return (0, None, None), (0, None, None, None, acc.valid)
    off, es = t.elem_layout()
    shape = t.arr.shape
    return (off, es, shape), (off, es, shape, None, acc.valid)


def check(log: EpochLog, t, acc, frames, kind: str, op: str, prev_kind: str = "wrote"):
    """Raise OutputDependencyError if ``acc`` (an Access of view ``t``) touches an element whose
    latest ``log`` epoch lies in one of the ``frames``' windows."""
    lo = frames[0].loop_start
    data = t.alloc.data
    key, (off, es, shape, offs, _valid) = _region(t, acc)
    box = None if offs is not None else layout_box(data, off, es, shape)
    if box is not None:
        hits = []
        for pkey, entry in log.pending.items():
            b = _entry_box(log, pkey, entry, data)
            if b is None or _overlap(b, box):
                hits.append(entry[0])
        if not hits:
            # no pending access touches the box: the replayed epochs are the latest ones there
            if log.arr is not None and log.arr_max >= lo:
                _check_elements(t, acc, frames, log.arr, kind, op, prev_kind)
            return
        if log.arr_max < lo and not any(e >= lo and _in_window(e, frames) for e in hits):
            return      # the latest epochs in the box are outside every window
    stamps = log.replay(data.shape)
    _check_elements(t, acc, frames, stamps, kind, op, prev_kind)


def record(log: EpochLog, t, acc, epoch: int, k) -> None:
    """Log access ``acc`` of view ``t`` at ``epoch`` (``k``: the running kernel)."""
    key, region = _region(t, acc)
    if key is None or acc.valid is not None:
        key = object()                   # masked / index-array accesses are never merged
    pending = log.pending
    if len(pending) >= _MAX_PENDING:
        # entries older than every open affine loop can never be in a window again
        dead = k.affine[0].loop_start if k.affine else epoch
        kept = {pk: p for pk, p in pending.items() if p[0] >= dead}
        if len(kept) >= _MAX_PENDING:
            log.replay(t.alloc.data.shape)
            kept = {}
        log.pending = pending = kept
        log.boxes = {pk: b for pk, b in log.boxes.items() if pk in kept}
    if key in pending:
        del pending[key]
    pending[key] = (epoch,) + region


def loop_var(f) -> str:
    if not f.var:
        line = linecache.getline(f.src[0], f.src[1])
        m = re.search(r"for\s+([A-Za-z_]\w*)\s+in\b", line)
        f.var = m.group(1) if m else f"<affine_range at {f.src[0].split('/')[-1]}:{f.src[1]}>"
    return f.var


def _check_elements(t, acc, frames, stamps: np.ndarray, kind: str, op: str, prev_kind: str):
    s = acc.gather(stamps)
    if acc.valid is None and s.size:
        # windows [loop_start, iter_start) of nested frames lie in [frames[0].loop_start,
        # frames[-1].iter_start): stamps all below or all at/after that range cannot conflict
        if _max(s, None) < frames[0].loop_start or _min(s, None) >= frames[-1].iter_start:
            return
    for f in frames:
        bad = (s >= f.loop_start) & (s < f.iter_start)
        if acc.valid is not None:
            bad &= acc.valid
        if bad.any():
            first = np.unravel_index(int(np.argmax(bad.reshape(-1))), bad.shape)
            e = int(s[first])
            j = bisect.bisect_right(f.starts, e) - 1
            prev = f.values[j] if j >= 0 else "?"
            raise E.OutputDependencyError(
                f"Unexpected output dependencies, missing indices in the dst access: {loop_var(f)} "
                f"('{op}' {kind} tensor {t.name} {list(t.shape)} at access index "
                f"{[int(i) for i in first]} in iteration {f.value} of nl.affine_range at "
                f"{f.src[0].split('/')[-1]}:{f.src[1]}, but iteration {prev} "
                f"{prev_kind} it; use "
                "nl.sequential_range for a loop-carried dependency)")
