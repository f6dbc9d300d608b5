"""DMA engine ops: copy (direct, indirect gather / scatter with oob skip, read-modify-write add),
transpose (direct and indirect gather-transpose), compute (sum of sources).

Views are core views; an indirect view is an advanced view whose ``indirect`` axis holds the
runtime row indices (see :mod:`nki_sim.positions`).  ``oob="skip"`` turns out-of-bounds rows into
no-ops (the destination keeps its values); ``"error"`` raises ``IndexError``.  Trace events carry
the legacy fields (descriptors from the HBM side: one per partition and contiguous run) plus
``attrs`` ``dge`` (the DGE mode asked for, when one was) and ``scalar_offset``.
"""

from __future__ import annotations

import numpy as np

from .. import trace
from ..access import Access, read, write
from .events import basic_runs, descriptors, free_size
from ..state import state
from ..tensor import Tensor
from .common import note_psum_write


def _buf(t: Tensor) -> str:
    return "hbm" if t.is_hbm else t.buffer


def _contiguous(acc) -> bool:
    """Whether the access's HBM elements, in (partition, free) order, are consecutive."""
    t = acc.t
    if acc.offs is None and t.idx is None:
        P, run, n = basic_runs(t)
        _, es = t.elem_layout()
        F = run * n
        return n <= 1 and (P == 1 or es[0] == F)
    o = (acc.offs if acc.offs is not None else t.flat_offsets()).reshape(-1)
    return o.size <= 1 or bool(np.all(np.diff(o) == 1))


def emit_dma(op, src: Tensor, dst: Tensor, hbm_acc: Access, count: int, *, name="", skipped=0,
             attrs=None):
    """One DMA event: the legacy field conventions (nki_sim/trace.py, descriptor rule)."""
    if not state.traces:
        return
    onchip = dst if dst.onchip else src
    hbm = hbm_acc.t
    desc = descriptors(hbm_acc, hbm.itemsize)
    indirect = hbm.indirect is not None
    a = dict(attrs or {})
    if hbm.is_hbm:
        a["hbm_contiguous"] = (not indirect) and hbm_acc.valid is None and _contiguous(hbm_acc)
    if indirect:
        a["index_rows"] = (onchip.shape[0] if onchip.shape else 1) - skipped
    trace.emit("dma", op, name=name, in_shapes=(src.shape,), out_shape=dst.shape,
               in_dtypes=(src.dtype,), out_dtype=dst.dtype,
               partitions=onchip.shape[0] if onchip.shape else 1,
               free_elems=free_size(onchip.shape), nbytes=count * hbm.itemsize,
               dma_kind="indirect" if indirect else "direct",
               src_buffer=_buf(src), dst_buffer=_buf(dst), descriptor_bytes=tuple(desc),
               skipped_rows=skipped, attrs=a, reads=(src.alloc.id,), writes=dst.alloc.id)


def _fit(mask, shape):
    if mask is None:
        return None
    if mask.shape == tuple(shape):
        return mask
    return mask.reshape(shape)


def copy(dst: Tensor, src: Tensor, *, oob: str = "error", rmw: str | None = None, name: str = "",
         op: str = "dma_copy", attrs=None) -> None:
    """``dst <- src`` element by element in C order (counts equal, shapes may differ), cast
    src -> fp32 -> dst.  ``rmw="add"``: ``dst += src`` with duplicate destinations accumulating."""
    if src.indirect is not None:
        vals, sacc = read(src, None, op=op, oob=oob)
        wmask = _fit(sacc.valid, dst.shape)
        skipped = sacc.skipped
    else:
        pre = Access(dst, None, oob) if dst.indirect is not None else None
        vals, sacc = read(src, _fit(pre.valid, src.shape) if pre is not None else None, op=op)
        wmask, skipped = None, 0
    v = np.asarray(vals)
    if v.shape != dst.shape:
        v = v.reshape(dst.shape)
    if rmw is not None:
        read(dst, wmask, op=op)
        dacc = write(dst, v, wmask, op=op, oob=oob, accumulate="rmw")
    else:
        dacc = write(dst, v, wmask, op=op, oob=oob)
    if dst.buffer == "psum":
        note_psum_write(dst, dacc, False)
    skipped = skipped or dacc.skipped
    hbm_acc = sacc if src.is_hbm else (dacc if dst.is_hbm else sacc)
    a = dict(attrs or {})
    if rmw is not None:
        a["rmw"] = True
    emit_dma(op, src, dst, hbm_acc, dacc.count(), name=name, skipped=skipped, attrs=a)


def transpose(dst: Tensor, src: Tensor, axes, *, oob: str = "error", name: str = "", attrs=None) -> None:
    """``dst = src.transpose(axes)`` through the DMA engines (gather-transpose for an indirect
    src: skipped rows leave their ``dst`` columns unchanged)."""
    vals, acc = read(src, None, op="dma_transpose", oob=oob)
    out = np.transpose(np.asarray(vals), axes)
    m = None if acc.valid is None else np.transpose(np.asarray(acc.valid), axes)
    if out.shape != dst.shape:
        out = out.reshape(dst.shape)
        m = None if m is None else m.reshape(dst.shape)
    dacc = write(dst, out, m, op="dma_transpose")
    a = dict(attrs or {})
    a["transpose"] = True
    emit_dma("dma_transpose", src, dst, acc, dacc.count(), name=name, skipped=acc.skipped, attrs=a)


def compute_sum(dst: Tensor, srcs, scales=None, *, oob: str = "error", name: str = "", attrs=None) -> None:
    """``dst = sum(scale_i * src_i)`` in fp32 (DMA compute; a source may be ``dst`` itself)."""
    total, skipped_valid, hbm_acc = None, None, None
    for i, s in enumerate(srcs):
        v, a = read(s, None, op="dma_compute", oob=oob)
        f = np.asarray(v, np.float32).reshape(dst.shape)
        if scales is not None and scales[i] != 1.0:
            f = f * np.float32(scales[i])
        total = f if total is None else total + f
        if s.is_hbm and hbm_acc is None:
            hbm_acc = a
        if a.valid is not None:
            skipped_valid = _fit(a.valid, dst.shape)
    dacc = write(dst, total, skipped_valid, op="dma_compute", oob=oob)
    if hbm_acc is None:
        hbm_acc = dacc
    a = dict(attrs or {})
    a["rmw"] = any(s.alloc is dst.alloc for s in srcs)
    emit_dma("dma_compute", srcs[0], dst, hbm_acc, dacc.count(), name=name,
             skipped=dacc.skipped, attrs=a)
