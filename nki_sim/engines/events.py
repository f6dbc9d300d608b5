"""Trace events of engine instructions (the contract :mod:`nki_sim.cost` reads).

* compute: ``emit_compute(engine, op, inputs, dst)``: in_shapes / in_dtypes of the tile operands,
  out_shape / out_dtype of the destination, src_buffer ("psum" when any operand is in PSUM, else
  the first operand's buffer; attr ``sbuf_input`` when PSUM and SBUF operands mix), dst_buffer,
  partitions = ``dst.shape[0]``, free_elems = elements per partition (or given), bytes = written
  elements x itemsize.
* DMA descriptors: one per (partition, maximal run of consecutive elements) of the HBM side,
  sized in bytes; skipped / masked elements produce none (nki_sim/trace.py).
"""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes as D
from .. import trace
from ..state import state


class Operand:
    """An operand as read by an instruction: values, dtype, shape, buffer and its view (None for
    a scalar)."""

    __slots__ = ("v", "dtype", "shape", "buffer", "t", "w")

    def __init__(self, v, dtype, shape, buffer="", t=None, w=None):
        self.v, self.dtype, self.shape, self.buffer, self.t = v, dtype, shape, buffer, t
        self.w = w          # written-element mask when the operand is only partly written

    @property
    def is_scalar(self):
        return self.t is None


def free_size(shape) -> int:
    return math.prod(shape[1:]) if len(shape) > 1 else 1


def emit_compute(engine, op, inputs, out, *, name="", free_elems=None, attrs=None, count=None):
    if not state.traces:
        return
    ins = [o for o in inputs if o is not None and o.t is not None]
    shape = out.shape
    n = out.size if count is None else count
    srcs = [o.t.alloc for o in ins if getattr(o.t, "alloc", None) is not None]
    from_psum = any(a.buffer == "psum" for a in srcs)
    if from_psum and any(a.buffer == "sbuf" for a in srcs):
        attrs = dict(attrs or {}, sbuf_input=True)      # PSUM and SBUF operands (cost: ports)
    dst_alloc = getattr(out, "alloc", None)
    trace.emit(engine, op, name=name, in_shapes=[o.shape for o in ins], out_shape=shape,
               src_buffer="psum" if from_psum else (srcs[0].buffer if srcs else ""),
               dst_buffer=getattr(dst_alloc, "buffer", "") or "",
               reads=[a.id for a in srcs], writes=getattr(getattr(out, "alloc", None), "id", None),
               in_dtypes=[o.dtype for o in ins], out_dtype=out.arr.dtype,
               partitions=shape[0] if shape else 1,
               free_elems=free_size(shape) if free_elems is None else free_elems,
               nbytes=n * out.arr.itemsize, attrs=attrs)


def free_contiguous(t) -> bool:
    """Whether the elements of each partition of tile view ``t`` are consecutive in memory
    (stride 1 along the free dims)."""
    if t.idx is not None:
        offs = t.flat_offsets()
        o = offs.reshape(offs.shape[0], -1) if offs.ndim else offs.reshape(1, 1)
        return o.shape[1] < 2 or bool(np.all(np.diff(o, axis=1) == 1))
    _, es = t.elem_layout()
    run = 1
    for n, s in zip(reversed(t.arr.shape[1:]), reversed(es[1:])):
        if n != 1:
            if s != run:
                return False
            run *= n
    return True


_TT_FAST = frozenset({"add", "multiply", "subtract"})


def tensor_tensor_attrs(alu: str, inputs, nl: bool = False) -> dict:
    """Event attrs of a ``tensor_tensor``: its ALU op; ``nl`` when an ``nki.language`` binary op
    of two tiles lowered to it (the compiler owns that lowering); ``strided`` when a tile operand
    is not contiguous along its free dims, recorded where the documented VectorE cost depends on
    it (bf16 operands, add / multiply / subtract)."""
    attrs = {"alu": alu}
    if nl:
        attrs["nl"] = True
    tiles = [o for o in inputs if o.t is not None]
    if alu in _TT_FAST and all(o.dtype == D.bfloat16 for o in tiles) and \
            not all(free_contiguous(o.t) for o in tiles):
        attrs["strided"] = True
    return attrs


def basic_runs(t):
    """(partitions, run length, runs per partition) of a basic view."""
    _, es = t.elem_layout()
    shape = t.arr.shape
    if not shape:
        return 1, 1, 1
    free = [(n, s) for n, s in zip(shape[1:], es[1:]) if n != 1]
    F = math.prod(n for n, _ in free)
    run = 1
    for n, s in reversed(free):
        if s != run:
            break
        run *= n
    return shape[0], run, (F // run if run else 0)


def descriptors(acc, itemsize: int) -> list:
    """Descriptor sizes (bytes) of one side of a transfer (runs of consecutive elements)."""
    t = acc.t
    if acc.offs is None and acc.valid is None and t.idx is None:
        P, run, n = basic_runs(t)
        return [run * itemsize] * (P * n)
    offs = acc.offs if acc.offs is not None else t.flat_offsets()
    if offs.ndim == 0:
        offs = offs.reshape(1, 1)
    P = offs.shape[0]
    o = offs.reshape(P, -1)
    F = o.shape[1]
    if F == 0 or P == 0:
        return []
    brk = np.ones((P, F), dtype=bool)
    if F > 1:
        brk[:, 1:] = np.diff(o, axis=1) != 1
    if acc.valid is None:
        starts = np.flatnonzero(brk.reshape(-1))
        lengths = np.diff(np.append(starts, P * F))
    else:
        v = np.broadcast_to(acc.valid, offs.shape).reshape(P, F)
        st = brk.copy()
        if F > 1:
            st[:, 1:] |= ~v[:, :-1]
        st &= v
        run_id = np.cumsum(st.reshape(-1)) - 1
        vv = v.reshape(-1)
        lengths = np.bincount(run_id[vv], minlength=int(st.sum())) if vv.any() else np.zeros(0, int)
    return (lengths * itemsize).tolist()
