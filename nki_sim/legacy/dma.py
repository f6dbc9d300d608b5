"""DMA instructions: nl.load / nl.store / nl.load_transpose2d / nisa.dma_copy / nisa.dma_transpose.

Indirect DMA: an SBUF index tile in the HBM-side subscript (on the partition axis of the
access) gathers / scatters rows; out-of-bounds rows raise ``IndexError`` with NumPy's
flattened message, or are skipped with ``oob_mode.skip`` (destination keeps its values).

Descriptor rule (trace): one descriptor per (partition, maximal contiguous run in HBM) of
the transfer, sized in bytes; masked-out / skipped elements produce none.  The events are the
engine layer's (:func:`nki_sim.engines.dma.emit_dma`), so the same transfer records the same
event in either front end.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as D
from .. import errors as E
from .. import sdk
from ..access import Access, read, write
from ..alu import alu_name
from ..config import config
from ..engines.dma import emit_dma as _emit_dma
from .compute import check_partitions, mask_for_input, require_kernel, result_tile
from ..indexing import mask_array
from ..target import get_target
from ..tensor import Tensor

def _oob(mode) -> str:
    if mode is None:
        return "error"
    name = getattr(mode, "name", None) or str(mode)
    if name.endswith("skip") or mode == 1:
        return "skip"
    return "error"


def load(src, *, mask=None, dtype=None, mode=None, oob_mode=None, name="", **kwargs):
    """HBM -> new SBUF tile (partition axis = first axis of the access)."""
    require_kernel("nl.load")
    sdk.check_kwargs("nl.load", (2, 23), mode=mode, oob_mode=oob_mode)
    if not isinstance(src, Tensor):
        raise TypeError(f"nl.load: src must be an HBM tensor access; got {type(src).__name__}")
    if not src.is_hbm:
        raise E.MemorySpaceError(
            f"Expected operand 'src' of 'load' to be in address space 'hbm', but got a tile in "
            f"'{src.buffer}' instead.")
    check_partitions(src.shape, "nl.load")
    m = mask_array(mask, src.shape) if mask is not None else None
    vals, acc = read(src, m, op="load", oob=_oob(oob_mode if oob_mode is not None else mode))
    out_dt = D.as_dtype(dtype) if dtype is not None else src.dtype
    out = result_tile(vals, out_dt, op="load", engine="dma", mask=acc.valid, shape=src.shape,
                      name=name, emit=False)
    _emit_dma("load", src, out, acc, acc.count(), name=name, skipped=acc.skipped)
    return out


def store(dst, value, *, mask=None, mode=None, oob_mode=None, name="", **kwargs):
    """SBUF / PSUM tile (or scalar) -> HBM."""
    require_kernel("nl.store")
    sdk.check_kwargs("nl.store", (2, 23), mode=mode, oob_mode=oob_mode)
    if not isinstance(dst, Tensor):
        raise TypeError(f"nl.store: dst must be an HBM tensor access; got {type(dst).__name__}")
    if not dst.is_hbm:
        raise E.MemorySpaceError(
            f"Expected operand 'dst' of 'store' to be in address space 'hbm', but got a tile in "
            f"'{dst.buffer}' instead.")
    check_partitions(dst.shape, "nl.store")
    m = mask_array(mask, dst.shape) if mask is not None else None
    if isinstance(value, Tensor):
        if value.is_hbm:
            raise E.MemorySpaceError(
                "Expected operand 'value' of 'store' to be in address space 'sbuf', but "
                f"got a tile in '{value.buffer}' instead.")
        if value.buffer == "psum" and not (config.allow_psum_store or sdk.has((2, 26))):
            raise E.MemorySpaceError(
                "Expected operand 'value' of 'store' to be in address space 'sbuf', but got a tile in "
                "'psum' instead. (Storing from PSUM needs Neuron SDK >= 2.26; copy it to SBUF with "
                "nl.copy first, or nki_sim.configure(allow_psum_store=True).)")
        pre = Access(dst, m, _oob(oob_mode if oob_mode is not None else mode))
        vm = mask_for_input(pre.valid, value.shape)
        vals, _ = read(value, vm, op="store")
        src = value
    else:
        vals = np.asarray(value)
        src = None
    acc = write(dst, vals, m, op="store", oob=_oob(oob_mode if oob_mode is not None else mode))
    if src is None:
        src = _ScalarSrc(dst)
    _emit_dma("store", src, dst, acc, acc.count(), name=name, skipped=acc.skipped)


class _ScalarSrc:
    def __init__(self, dst):
        self.shape, self.dtype, self.buffer = dst.shape, dst.dtype, "sbuf"
        self.is_hbm, self.onchip, self.itemsize = False, True, dst.itemsize


def load_transpose2d(src, *, dtype=None, mask=None, name="", **kwargs):
    """HBM [N, M] -> SBUF [M, N] (DMA transpose)."""
    require_kernel("nl.load_transpose2d")
    if not isinstance(src, Tensor) or not src.is_hbm:
        raise E.MemorySpaceError("Expected operand 'src' of 'load_transpose2d' to be in address space 'hbm'")
    if src.indirect is not None:
        raise E.IndexingError("indirect indices are not supported with nl.load_transpose2d "
                              "(err_indirect_indices_are_not_supported_with_nki_api)",
                              code="err_indirect_indices_are_not_supported_with_nki_api")
    if src.ndim != 2:
        raise ValueError(f"nl.load_transpose2d: src must be 2-D; got {list(src.shape)}")
    check_partitions((src.shape[1],), "nl.load_transpose2d")
    vals, acc = read(src, None, op="load_transpose2d")
    out_dt = D.as_dtype(dtype) if dtype is not None else src.dtype
    out = result_tile(np.asarray(vals).T, out_dt, op="load_transpose2d", engine="dma",
                      name=name, emit=False)
    _emit_dma("load_transpose2d", src, out, acc, acc.count(), name=name, attrs={"transpose": True})
    return out


def dma_copy(*, dst, src, mask=None, dst_rmw_op=None, oob_mode=None, dge_mode=None, name="",
             **kwargs):
    """DMA copy HBM<->SBUF or SBUF->SBUF with cast; ``dst_rmw_op=np.add`` accumulates."""
    require_kernel("nisa.dma_copy")
    sdk.check_kwargs("nisa.dma_copy", (2, 23), dst_rmw_op=dst_rmw_op, oob_mode=oob_mode,
                     dge_mode=dge_mode)
    for pname, t in (("dst", dst), ("src", src)):
        if not isinstance(t, Tensor):
            raise TypeError(f"nisa.dma_copy: {pname} must be a tensor access; got {type(t).__name__}")
        if t.buffer == "psum":
            raise E.MemorySpaceError(
                f"Expected operand '{pname}' of 'dma_copy' to be in address space 'hbm' or 'sbuf', "
                "but got a tile in 'psum' instead.")
    oob = _oob(oob_mode)
    m = mask_array(mask, dst.shape) if mask is not None else None
    if src.indirect is not None:
        sm = mask_for_input(m, src.shape)
        vals, sacc = read(src, sm, op="dma_copy", oob=oob)
        wmask = m
        if sacc.valid is not None:
            sv = mask_for_input(sacc.valid, dst.shape)
            wmask = sv if m is None else (m & sv)
        skipped = sacc.skipped
    else:
        pre = Access(dst, m, oob) if dst.indirect is not None else None
        sm = mask_for_input(pre.valid if pre is not None else m, src.shape)
        vals, sacc = read(src, sm, op="dma_copy")
        wmask = m
        skipped = 0
    if dst_rmw_op is not None:
        if alu_name(dst_rmw_op, "nisa.dma_copy dst_rmw_op") != "add":
            raise NotImplementedError("nisa.dma_copy: only dst_rmw_op=np.add is supported")
        if oob == "skip":
            raise ValueError("nisa.dma_copy: dst_rmw_op requires oob_mode=oob_mode.error")
        read(dst, wmask, op="dma_copy")
        dacc = write(dst, vals, wmask, op="dma_copy", oob=oob, accumulate="rmw")
    else:
        dacc = write(dst, vals, wmask, op="dma_copy", oob=oob)
    skipped = skipped or dacc.skipped
    hbm_acc = sacc if src.is_hbm else (dacc if dst.is_hbm else None)
    if hbm_acc is None:
        hbm_acc = sacc
    _emit_dma("dma_copy", src, dst, hbm_acc, dacc.count(), name=name, skipped=skipped,
              attrs={"rmw": True} if dst_rmw_op is not None else None)


_DMA_T_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(src, *, axes=None, mask=None, dtype=None, name="", **kwargs):
    """DMA transpose (NeuronCore-v3 only) of an HBM or SBUF tile into a new SBUF tile."""
    require_kernel("nisa.dma_transpose")
    sdk.check_kwargs("nisa.dma_transpose", (2, 26), axes=axes, dge_mode=kwargs.get("dge_mode"))
    tgt = get_target()
    if not tgt.has_dma_transpose:
        raise E.TargetError(
            f"nisa.dma_transpose requires NeuronCore-v3 (trn2 / gen3); the target is {tgt.name} "
            f"({tgt.nc_version}). Branch on nisa.get_nc_version() and use nisa.nc_transpose on gen2.")
    if not isinstance(src, Tensor):
        raise TypeError(f"nisa.dma_transpose: src must be a tile; got {type(src).__name__}")
    if src.buffer == "psum":
        raise E.MemorySpaceError(
            "Expected operand 'src' of 'dma_transpose' to be in address space 'hbm' or 'sbuf', but "
            "got a tile in 'psum' instead.")
    if src.indirect is not None:
        raise E.IndexingError("indirect indices are not supported with nisa.dma_transpose "
                              "(err_indirect_indices_are_not_supported_with_nki_api)",
                              code="err_indirect_indices_are_not_supported_with_nki_api")
    if src.itemsize not in (2, 4):
        raise E.DtypeError(f"nisa.dma_transpose supports 2- and 4-byte dtypes; got {src.dtype.name}")
    default = _DMA_T_AXES.get(src.ndim)
    if default is None:
        raise ValueError(f"nisa.dma_transpose: src must be 2-D to 4-D; got {list(src.shape)}")
    ax = tuple(axes) if axes is not None else default
    if ax != default:
        raise ValueError(f"nisa.dma_transpose: axes must be {default} for a {src.ndim}-D tile; got {ax}")
    out_shape = tuple(src.shape[i] for i in ax)
    check_partitions(out_shape, "nisa.dma_transpose")
    vals, acc = read(src, None, op="dma_transpose")
    out_dt = D.as_dtype(dtype) if dtype is not None else src.dtype
    m = mask_array(mask, out_shape) if mask is not None else None
    out = result_tile(np.transpose(np.asarray(vals), ax), out_dt, op="dma_transpose", engine="dma",
                      mask=m, name=name, emit=False)
    # descriptors follow the source read order (rows of the source), transposed in flight
    _emit_dma("dma_transpose", src, out, acc, out.size if m is None else int(m.sum()), name=name,
              attrs={"transpose": True})
    return out
