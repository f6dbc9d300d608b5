"""Event trace: one immutable :class:`Event` per instruction and per DMA.

    with nki_sim.tracing() as trace:
        out = nki.simulate_kernel(kernel[1, 8], ...)
    trace.events, trace.summary(), trace.to_chrome_json(path)

Descriptor rule (DMA): one descriptor per (partition, maximal contiguous run in HBM) of
the transfer; its size in bytes is that run's length.  Masked-out / skipped rows produce no
descriptor.  Events carry no timing: the simulator is eager (see nki_sim/README.md).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass

from .dtypes import dname
from .state import state
from .target import TARGETS, get_target

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
_PKG = __name__.split(".")[0]          # "nki_sim"


def in_simulator(frame) -> bool:
    """True for frames of nki_sim's own modules (by module name, robust to how it was imported)."""
    name = frame.f_globals.get("__name__", "")
    return name == _PKG or name.startswith(_PKG + ".")


@dataclass(frozen=True)
class Event:
    seq: int
    engine: str
    op: str
    name: str
    in_shapes: tuple
    out_shape: tuple
    in_dtypes: tuple
    out_dtype: str
    partitions: int
    free_elems: int
    bytes: int
    src_loc: tuple
    loop_indices: tuple
    program_id: tuple
    dma_kind: str = ""
    src_buffer: str = ""
    dst_buffer: str = ""
    descriptor_bytes: tuple = ()
    skipped_rows: int = 0
    attrs: tuple = ()
    launch: int = 0            # the trace's kernel launch that issued it (``begin_launch``)

    def attr(self, key, default=None):
        for k, v in self.attrs:
            if k == key:
                return v
        return default


class Trace:
    """Events of everything simulated inside a ``tracing()`` block, in issue order."""

    def __init__(self):
        self.events: list[Event] = []
        self.peak_bytes_per_partition = {"sbuf": 0, "psum": 0}
        self.targets: dict = {}      # target name -> {"sbuf": peak, "psum": peak} of runs on it
        self.writers: dict = {}      # allocation id -> seq of the event that last wrote it
        self.launch = 0              # kernel launches begun while tracing (Event.launch)
        self.call_sites_past = ()    # path fragments src_loc skips past (tracing())

    def _note_run(self, target):
        self.targets.setdefault(target.name, {"sbuf": 0, "psum": 0})
        self.launch += 1

    def launches(self) -> list:
        """The events split by kernel launch (``Event.launch``), in issue order: one list per
        launch, e.g. the class launches of a mixed batch. Launches run one after the other."""
        return split_launches(self.events)

    def _note_live(self, buffer, nbytes, target=None):
        """A program's peak live bytes per partition of ``buffer`` (``memory.Live.finish``), on
        ``target`` (default: the running kernel's)."""
        if nbytes > self.peak_bytes_per_partition[buffer]:
            self.peak_bytes_per_partition[buffer] = nbytes
        if target is None:
            k = state.kernel
            target = k.target if k is not None else None
        if target is not None:
            per = self.targets.setdefault(target.name, {"sbuf": 0, "psum": 0})
            if nbytes > per[buffer]:
                per[buffer] = nbytes

    def summary(self) -> dict:
        ev = self.events
        dma = [e for e in ev if e.engine == "dma"]
        eng = Counter(e.engine for e in ev)
        names = list(self.targets)
        t = TARGETS[names[-1]] if names else get_target()
        over = {b: any(p[b] > (TARGETS[n].sbuf_usable_bytes_per_partition if b == "sbuf"
                               else TARGETS[n].psum_bytes_per_partition)
                       for n, p in self.targets.items()) for b in ("sbuf", "psum")}
        return {
            "instructions": len(ev),
            "engine_instructions": {k: eng.get(k, 0) for k in ENGINES},
            "dma_instructions": len(dma),
            "dma_direct_instructions": sum(e.dma_kind == "direct" for e in dma),
            "dma_indirect_instructions": sum(e.dma_kind == "indirect" for e in dma),
            "dma_descriptors": sum(len(e.descriptor_bytes) for e in dma),
            "dma_bytes": sum(e.bytes for e in dma),
            "dma_skipped_rows": sum(e.skipped_rows for e in dma),
            "ops": dict(Counter(e.op for e in ev)),
            "peak_sbuf_bytes_per_partition": self.peak_bytes_per_partition["sbuf"],
            "peak_psum_bytes_per_partition": self.peak_bytes_per_partition["psum"],
            "sbuf_capacity_bytes_per_partition": t.sbuf_usable_bytes_per_partition,
            "psum_capacity_bytes_per_partition": t.psum_bytes_per_partition,
            "sbuf_over_capacity": over["sbuf"],
            "psum_over_capacity": over["psum"],
            "target": t.name,                      # target of the (last) simulated run
            "targets": names,
            "launches": len(split_launches(ev)),   # kernel launches with events (Event.launch)
        }

    def to_chrome_json(self, path=None) -> dict:
        """Chrome / Perfetto trace: one row per engine, events laid end to end in issue order.

        Timestamps are the issue sequence (1 unit per event per engine), not a time model.
        """
        tids = {e: i for i, e in enumerate(ENGINES + ("sync",))}
        clock: dict = {}
        cores = sorted({e.attr("core", 0) for e in self.events}) or [0]
        out = [{"ph": "M", "name": "thread_name", "pid": c, "tid": i, "args": {"name": e}}
               for c in cores for e, i in tids.items()]
        for e in self.events:
            pid = e.attr("core", 0)            # one process row group per logical core
            ts = clock.get((pid, e.engine), 0)
            clock[(pid, e.engine)] = ts + 1
            out.append({
                "name": e.op + (f":{e.name}" if e.name else ""), "ph": "X", "pid": pid,
                "tid": tids[e.engine], "ts": ts, "dur": 1,
                "args": {"seq": e.seq, "shape": list(e.out_shape), "dtype": e.out_dtype,
                         "bytes": e.bytes, "src": f"{e.src_loc[0]}:{e.src_loc[1]}",
                         "loop": list(e.loop_indices), "program_id": list(e.program_id),
                         "descriptors": len(e.descriptor_bytes), "dma_kind": e.dma_kind,
                         "launch": e.launch},
            })
        doc = {"traceEvents": out, "displayTimeUnit": "ns",
               "otherData": {"note": "nki_sim issue order; no timing model"}}
        if path is not None:
            with open(path, "w") as f:
                json.dump(doc, f)
        return doc


def begin_launch(target) -> None:
    """A kernel launch starts (both front ends call this once per launch, before its first
    instruction; an LNC=2 launch is one launch): every active trace counts it, and the events
    it records next carry that count as ``Event.launch``."""
    for tr in state.traces:
        tr._note_run(target)


def split_launches(events) -> list:
    """``events`` grouped by ``Event.launch`` (first-appearance order), each group in issue
    order; events without the field (built elsewhere) count as one launch."""
    groups: dict = {}
    for ev in events:
        groups.setdefault(getattr(ev, "launch", 0), []).append(ev)
    return list(groups.values())


@contextlib.contextmanager
def tracing(call_sites_past=()):
    """Record events of all kernels simulated inside the block.

    ``call_sites_past``: path fragments (e.g. ``"kernels/ops/"``) of helper modules that a
    profile wants to see through: an event's ``src_loc`` is then the innermost frame outside
    the simulator AND outside every file whose path contains one of them -- the line that
    called the helper -- instead of the helper's own line (slower: each event walks its
    frames)."""
    t = Trace()
    t.call_sites_past = tuple(call_sites_past)
    state.traces.append(t)
    try:
        yield t
    finally:
        state.traces.remove(t)


def note_write(dst_alloc: int, src_alloc: int, dst_buffer: str = "", dst_shape=None,
               itemsize: int = 0) -> None:
    """The result in allocation ``src_alloc`` was written into ``dst_alloc`` (an instruction's
    output tile assigned to its destination): ``dst_alloc``'s writer becomes that instruction,
    and its event's ``dst_buffer`` the destination's buffer when given. A result broadcast into
    a larger destination (``dst_shape``) makes the instruction write the destination: its
    event's out_shape, free_elems and bytes become the destination's."""
    for t in state.traces:
        seq = t.writers.get(src_alloc)
        if seq is not None:
            t.writers[dst_alloc] = seq
            ev = t.events[seq]
            if ev.engine in ("dma", "tensor"):
                continue
            if dst_buffer and ev.dst_buffer != dst_buffer:
                ev.__dict__["dst_buffer"] = dst_buffer
            if dst_shape is not None and len(dst_shape) > 1:
                free = 1
                for n in dst_shape[1:]:
                    free *= int(n)
                if free > ev.free_elems and int(dst_shape[0]) >= ev.partitions:
                    ev.__dict__.update(out_shape=tuple(map(int, dst_shape)), free_elems=free,
                                       bytes=int(dst_shape[0]) * free * itemsize)


def active() -> bool:
    return bool(state.traces)


_in_sim_code: dict = {}      # code object -> whether it belongs to nki_sim (cache)
_basenames: dict = {}        # co_filename -> basename (cache)


_depths: dict = {}           # code object of emit's caller -> depths of the kernel frame seen
_kernel_side: dict = {}      # code object -> whether its frames run inside the kernel call (cache)


def _inside_kernel(frame) -> bool:
    """Whether ``frame`` runs inside the running kernel's call (the kernel function's frame is
    among its callers), cached per code object: a depth remembered for one call stack may, on
    another, land on the code that LAUNCHED the kernel (a test calling ``simulate_kernel``), whose
    caller below is nki_sim too. Checked only on the remembered-depth path; a code object found
    outside (or too deep to tell) sends events to the full walk, which is always right."""
    code = frame.f_code
    inside = _kernel_side.get(code)
    if inside is None:
        k = state.kernel
        top = k.code if k is not None else None
        if top is None:
            return True
        inside, f, n = False, frame, 0
        while f is not None and n < 64:
            if f.f_code is top:
                inside = True
                break
            f, n = f.f_back, n + 1
        if len(_kernel_side) > 50000:     # bounded, as _in_sim_code
            _kernel_side.clear()
        _kernel_side[code] = inside
    return inside


def _sim_code(code, frame) -> bool:
    sim = _in_sim_code.get(code)
    if sim is None:
        if len(_in_sim_code) > 50000:     # bounded: kernels built at run time make new code
            _in_sim_code.clear()
        sim = _in_sim_code[code] = in_simulator(frame)
    return sim


def _loc(frame) -> tuple:
    fn = frame.f_code.co_filename
    base = _basenames.get(fn)
    if base is None:
        base = _basenames[fn] = os.path.basename(fn)
    return (base, frame.f_lineno)


def call_site_loc(past) -> tuple:
    """(file basename, line) of the innermost frame outside nki_sim and outside every file
    whose path contains a fragment of ``past`` (:func:`tracing`'s ``call_sites_past``)."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not _sim_code(f.f_code, f) and not any(p in fn for p in past):
            return _loc(f)
        f = f.f_back
    return ("", 0)


def kernel_src_loc() -> tuple:
    """(file basename, line) of the innermost frame outside the nki_sim package.

    Walking ``f_back`` creates a frame object per level; instead the depth found last time
    for the same calling code is tried first (``sys._getframe(d)`` creates only the frame at
    depth d) and verified: the frame there is outside nki_sim and the one below it inside."""
    getframe = sys._getframe
    caller = getframe(1)
    key = caller.f_code
    known = _in_sim_code
    for d in _depths.get(key, ()):
        try:
            f = getframe(d)
        except ValueError:
            continue
        code = f.f_code
        sim = known.get(code)
        if not (_sim_code(code, f) if sim is None else sim):
            below = getframe(d - 1)
            sim = known.get(below.f_code)
            if (_sim_code(below.f_code, below) if sim is None else sim) and _inside_kernel(f):
                base = _basenames.get(code.co_filename)
                return _loc(f) if base is None else (base, f.f_lineno)
    f, d = caller, 1
    while f is not None:
        if not _sim_code(f.f_code, f):
            seen = _depths.setdefault(key, [])
            if d not in seen and len(seen) < 8:
                bisect.insort(seen, d)        # tried innermost first
            return _loc(f)
        f = f.f_back
        d += 1
    return ("", 0)


_new = object.__new__
_setattr = object.__setattr__


def emit(engine, op, *, name="", in_shapes=(), out_shape=(), in_dtypes=(), out_dtype="",
         partitions=0, free_elems=0, nbytes=0, dma_kind="", src_buffer="", dst_buffer="",
         descriptor_bytes=(), skipped_rows=0, attrs=None, reads=(), writes=None):
    """Append an event to every active trace of the calling thread (no-op when not tracing).

    Dtypes may be given as NumPy dtypes or names. ``reads`` / ``writes``: ids of the allocations
    the instruction reads / writes; the event's ``deps`` are the seqs of the events that last
    wrote what it reads, as attr ``deps`` (allocation granularity: a write to any part of a
    tensor counts)."""
    s = state
    traces = s.traces
    if not traces:
        return
    k = s.kernel
    fields = {
        "seq": 0, "engine": engine, "op": op, "name": name or "",
        "in_shapes": tuple([sh if type(sh) is tuple else tuple(map(int, sh)) for sh in in_shapes]),
        "out_shape": out_shape if type(out_shape) is tuple else tuple(map(int, out_shape)),
        "in_dtypes": tuple([d if type(d) is str else dname(d) for d in in_dtypes]),
        "out_dtype": out_dtype if type(out_dtype) is str else dname(out_dtype),
        "partitions": int(partitions), "free_elems": int(free_elems), "bytes": int(nbytes),
        "src_loc": (call_site_loc(traces[-1].call_sites_past) if traces[-1].call_sites_past
                    else kernel_src_loc()),
        "loop_indices": tuple([f.value for f in k.loops]) if k else (),
        "program_id": tuple(k.program_id) if k else (),
        "dma_kind": dma_kind, "src_buffer": src_buffer, "dst_buffer": dst_buffer,
        "descriptor_bytes": descriptor_bytes, "skipped_rows": skipped_rows,
        "attrs": tuple(sorted(attrs.items())) if attrs else (),
    }
    core = getattr(k, "lnc_core", None) if k is not None else None
    if core is not None:                  # a logical-core launch: the core's own timeline
        fields["attrs"] = tuple(sorted(dict(fields["attrs"], core=core).items()))
    last = traces[-1]
    for t in traces:
        ev = _new(Event)                    # the frozen dataclass, without its per-field __init__
        d = fields if t is last else dict(fields)
        d["seq"] = seq = len(t.events)
        d["launch"] = t.launch
        if reads:
            w = t.writers
            deps = tuple(sorted({w[a] for a in reads if a in w}))
            if deps:
                d["attrs"] = tuple(sorted(fields["attrs"] + (("deps", deps),)))
        if writes is not None:
            t.writers[writes] = seq
        _setattr(ev, "__dict__", d)
        t.events.append(ev)
