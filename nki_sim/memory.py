"""Memory model: allocations, live on-chip bytes, per-element written bitmap and epochs.

An :class:`Alloc` owns one C-contiguous NumPy array in the *declared* storage dtype
(bf16/fp8 through ml_dtypes).  Fresh memory is poisoned (NaN / integer max) and its
``written`` bitmap is all False; ``written is None`` means "fully initialised" (kernel
inputs), which avoids a bitmap for large HBM tensors.  ``wlog`` / ``rlog`` (created lazily)
log the epochs of writes / reads inside ``affine_range`` iterations for the loop-carried
dependency checker (:mod:`nki_sim.deps`).

Live bytes per partition of SBUF and PSUM (:class:`Live`, one per SPMD program) count an
on-chip allocation from its allocation to its last access (read or write): the lifetime a
compiler's allocator gives a tile, whatever Python still references. The peak is taken when the
program ends (:meth:`Live.finish`), since only then is every last access known.
"""

from __future__ import annotations

import itertools

import numpy as np

from . import dtypes as D
from .state import state

HBM_BUFFERS = ("hbm", "private_hbm", "shared_hbm")
ONCHIP = ("sbuf", "psum")
_ids = itertools.count(1)


class Live:
    """On-chip lifetimes of one SPMD program (each program has its own SBUF / PSUM): a record
    ``[born, last, bytes per partition, buffer, name, live]`` per allocation (no reference to
    its storage), on a clock that ticks at every allocation and every access (:func:`touch`)."""

    __slots__ = ("clock", "records")

    def __init__(self):
        self.clock = 0
        self.records: list = []

    def born(self, buffer: str, nbytes: int, alloc: "Alloc") -> list:
        self.clock += 1
        rec = [self.clock, self.clock, nbytes, buffer, alloc._name or alloc.id, self]
        self.records.append(rec)
        return rec

    def peaks(self) -> dict:
        """``{buffer: (peak bytes per partition, name of the allocation that reached it)}``: a
        sweep over the lifetimes (an allocation is dead after its last access)."""
        out = {}
        for buf in ONCHIP:
            recs = [r for r in self.records if r[3] == buf]
            if not recs:
                out[buf] = (0, "")
                continue
            born = np.fromiter((r[0] for r in recs), np.float64, len(recs))
            last = np.fromiter((r[1] for r in recs), np.float64, len(recs))
            nb = np.fromiter((r[2] for r in recs), np.int64, len(recs))
            t = np.concatenate([born, last + 0.5])
            delta = np.concatenate([nb, -nb])
            order = np.argsort(t, kind="stable")
            total = np.cumsum(delta[order])
            i = int(np.argmax(total))
            name = recs[int(order[i])][4]
            out[buf] = (int(total[i]), name if isinstance(name, str) else f"{buf}_{name}")
        return out

    def finish(self, target=None) -> dict:
        """The program's peaks (:meth:`peaks`), noted on every active trace (per ``target``)."""
        peaks = self.peaks()
        for buf, (nbytes, _) in peaks.items():
            if nbytes:
                for t in state.traces:
                    t._note_live(buf, nbytes, target)
        return peaks


def touch(alloc: "Alloc") -> None:
    """An access of ``alloc`` now: its lifetime extends to here (on-chip allocations)."""
    rec = alloc.rec
    if rec is not None:
        live = rec[5]
        live.clock += 1
        rec[1] = live.clock


def current_live() -> Live | None:
    """The lifetimes of the running program; None outside any kernel (no program to take a
    peak of: such allocations are not tracked)."""
    k = state.kernel
    return k.live if k is not None else None


class Alloc:
    """One allocation (a tensor's storage)."""

    __slots__ = ("id", "buffer", "dtype", "data", "written", "_name", "kind", "mutable",
                 "birth_epoch", "wlog", "rlog", "par_axis", "bytes_pp", "user_array",
                 "ever_written", "rec", "scope", "temp", "wmax", "rmax", "lazy_poison", "unwritten",
                 "__weakref__")

    def __init__(self, data: np.ndarray, buffer: str, name: str = "", kind: str = "local",
                 written=False, par_axis: int = 0, mutable: bool = True, count_live: bool = True):
        # data: C-contiguous (the aux arrays -- written bitmap, epochs -- share its layout)
        self.id = next(_ids)
        self.buffer = buffer
        self.dtype = data.dtype
        self.data = data
        if written is True:
            self.written = None
            self.unwritten = 0
        elif written is False:
            self.written = np.zeros(data.shape, dtype=bool)
            self.unwritten = data.size
        else:       # the aux views of nki_sim.tensor assume C order (same layout as data)
            self.written = np.ascontiguousarray(written, dtype=bool)
            self.unwritten = data.size - int(np.count_nonzero(self.written))
        self._name = name
        self.kind = kind
        self.mutable = mutable
        s = state
        self.birth_epoch = s.epoch
        k = s.kernel
        # innermost enclosing affine / sequential loop: the tensor's scope
        self.scope = None
        if k is not None and k.loops:
            for f in reversed(k.loops):
                if f.kind != "static":
                    self.scope = f
                    break
        self.wlog = None        # nki_sim.deps.EpochLog of writes / reads inside affine_range loops
        self.rlog = None
        self.wmax = self.rmax = -1     # largest epoch ever logged (fast path of the checker)
        self.par_axis = par_axis
        self.user_array = None
        self.ever_written = False
        self.temp = False       # an instruction's result tile (poison propagates through it)
        self.lazy_poison = False  # data not yet poisoned where never written (see poison())
        self.bytes_pp = 0
        self.rec = None         # Live record (on-chip): [born, last access, bytes, buffer, ...]
        if count_live and buffer in ONCHIP:
            n = data.size // max(1, data.shape[par_axis]) if data.ndim else 1
            self.bytes_pp = int(n * data.dtype.itemsize)
            live = current_live()
            if live is not None:
                self.rec = live.born(buffer, self.bytes_pp, self)

    @property
    def name(self) -> str:
        """The tensor name given at allocation, else ``<buffer>_<id>``."""
        return self._name or f"{self.buffer}_{self.id}"

    def poison(self) -> None:
        """Fill never-written elements with the poison value (deferred from allocation until
        unwritten memory is first exposed: a read touching it, an output, a dtype view)."""
        if self.lazy_poison:
            self.lazy_poison = False
            if self.written is not None:
                np.copyto(self.data, D.poison_value(self.dtype), where=~self.written)

    @property
    def shape(self):
        return self.data.shape


def new_alloc(shape, dtype, buffer: str, name: str = "", par_axis: int = 0,
              fill=None, kind: str = "local") -> Alloc:
    """Allocate poisoned (or ``fill``-initialised) memory.  The poison fill is deferred
    (``Alloc.poison``): memory that is fully written before it is read never needs it."""
    d = np.dtype(dtype)
    if fill is None:
        a = Alloc(np.empty(shape, dtype=d), buffer, name=name, kind=kind, par_axis=par_axis)
        a.lazy_poison = True
        return a
    data = np.full(shape, D.cast_for_write(np.asarray(fill), d), dtype=d)
    return Alloc(data, buffer, name=name, kind=kind, written=True, par_axis=par_axis)
