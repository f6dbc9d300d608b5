"""``nisa.dma_copy`` / ``dma_transpose`` / ``dma_compute`` of the current API (reference §4.1).

Argument conventions and checks live here; the data movement is :mod:`nki_sim.engines.dma`.
DGE rules checked (beyond AWS's simulator): no hwdge gathers / scatters (vector_offset needs
swdge), hwdge needs NeuronCore-v3+, hwdge copies keep the dtype, ``dge_mode.none`` is not
allowed inside ``nl.fori_loop``, ``engine=`` only with hwdge.
"""

from __future__ import annotations

from .. import errors as E
from ..alu import alu_name
from ..engines import dma as dma_engine
from ..target import get_target
from . import control
from .checks import require_kernel, buffer_in, fail, partitions, same_elements, tile
from .enums import dge_mode as _dge, engine as _engine, oob_mode as _oob, member


_DMA_T_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def _attrs(mode, *views) -> dict:
    a = {}
    if mode is not _dge.unknown:
        a["dge"] = mode.name
    if any(v._ind is not None and v._ind.kind == "scalar" for v in views):
        a["scalar_offset"] = True
    return a


def _vector(v) -> bool:
    return v._ind is not None and v._ind.kind == "vector"


def _check_dge(op, mode, dst, src):
    tgt = get_target()
    if mode is _dge.hwdge:
        if tgt.nc_version == "gen2":
            fail(f"{op}: dge_mode.hwdge needs NeuronCore-v3+ (trn2); the target is {tgt.name}")
        if _vector(dst) or _vector(src):
            fail(f"{op}: hardware DGE cannot gather or scatter (vector_offset); use dge_mode.swdge "
                 "(or dge_mode.unknown)")
    if mode is _dge.none and control.in_fori_loop():
        fail(f"{op}: dge_mode.none (host-precomputed descriptors) is not allowed inside nl.fori_loop; "
             "use dge_mode.hwdge")


def dma_copy(dst, src, priority=None, oob_mode=None, dge_mode=None, engine=None, name=""):
    """``dst <- src`` (SBUF / HBM, counts equal, cast src -> fp32 -> dst)."""
    require_kernel("nisa.dma_copy")
    dst, src = tile(dst, "dma_copy", "dst"), tile(src, "dma_copy", "src")
    oob = member(_oob, oob_mode, "oob_mode", _oob.error)
    mode = member(_dge, dge_mode, "dge_mode", _dge.unknown)
    eng = member(_engine, engine, "engine", _engine.unknown)
    if priority is not None and get_target().nc_version != "gen4":
        fail("dma_copy: priority= is NeuronCore-v4 only")
    buffer_in("dma_copy src", src, ("hbm", "sbuf"))
    buffer_in("dma_copy dst", dst, ("hbm", "sbuf"))
    partitions("dma_copy", "dst", dst)
    partitions("dma_copy", "src", src)
    same_elements("dma_copy", dst, src)
    _check_dge("dma_copy", mode, dst, src)
    if eng is not _engine.unknown:
        if eng not in (_engine.sync, _engine.scalar):
            fail(f"dma_copy: engine must be nisa.engine.sync or nisa.engine.scalar; got {eng}")
        if mode is not _dge.hwdge:
            fail("dma_copy: engine= applies to hardware DGE only (dge_mode=nisa.dge_mode.hwdge)")
    if mode is _dge.hwdge and dst.dtype != src.dtype:
        fail(f"dma_copy: hwdge copies cannot convert dtypes ({src.dtype} -> {dst.dtype}); use .view()")
    a = _attrs(mode, dst, src)
    dma_engine.copy(dst.core(), src.core(), oob=oob.name, name=name, attrs=a)


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=None, oob_mode=None, name=""):
    """``dst = src.transpose(axes)`` on the DMA engines (gen3+); gather-transpose for a
    ``vector_offset`` src."""
    require_kernel("nisa.dma_transpose")
    dst, src = tile(dst, "dma_transpose", "dst"), tile(src, "dma_transpose", "src")
    tgt = get_target()
    if not tgt.has_dma_transpose:
        raise E.TargetError(f"nisa.dma_transpose requires NeuronCore-v3+ (trn2); the target is "
                            f"{tgt.name}; use nisa.nc_transpose")
    mode = member(_dge, dge_mode, "dge_mode", _dge.unknown)
    oob = member(_oob, oob_mode, "oob_mode", _oob.error)
    buffer_in("dma_transpose dst", dst, ("sbuf",))
    buffer_in("dma_transpose src", src, ("hbm", "sbuf"))
    partitions("dma_transpose", "dst", dst)
    if dst.dtype != src.dtype:
        fail(f"dma_transpose: dst dtype {dst.dtype} must equal src dtype {src.dtype}")
    if dst.ndim != src.ndim:
        fail(f"dma_transpose: dst rank {dst.ndim} must equal src rank {src.ndim}")
    default = _DMA_T_AXES.get(src.ndim)
    if default is None:
        fail(f"dma_transpose: src must be 2-D to 4-D; got {list(src.shape)}")
    ax = tuple(axes) if axes is not None else default
    if ax != default:
        fail(f"dma_transpose: axes must be {default} for a {src.ndim}-D src; got {ax}")
    want = tuple(src.shape[i] for i in ax)
    if dst.shape != want:
        fail(f"dma_transpose: dst shape {list(dst.shape)} must be the transposed src shape {list(want)}")
    from .dtypes import itemsize
    isz = itemsize(src.dtype)
    if _vector(src):
        if mode is _dge.hwdge:
            fail("dma_transpose: an indirect (vector_offset) src needs dge_mode.swdge")
        if isz != 2:
            fail(f"dma_transpose: an indirect src must have a 2-byte dtype; got {src.dtype}")
        if src.shape[-1] > 128:
            fail(f"dma_transpose: src.shape[-1] = {src.shape[-1]} exceeds 128")
        if src.ndim == 4 and 1 not in (src.shape[1], src.shape[2]):
            fail(f"dma_transpose: a 4-D indirect src needs dim 1 or dim 2 of size 1; got {list(src.shape)}")
        if src.shape[0] % 16:
            fail(f"dma_transpose: an indirect src needs shape[0] % 16 == 0; got {src.shape[0]}")
        n = src._ind.index.shape[0]
        if not (16 <= n <= 128 and n % 16 == 0):
            fail(f"dma_transpose: indices need shape[0] in [16, 128] and a multiple of 16; got {n}")
    else:
        if oob is _oob.skip and src._ind is None:
            fail("dma_transpose: oob_mode.skip needs an indirect src")
        if isz not in (2, 4):
            fail(f"dma_transpose supports 2- and 4-byte dtypes; got {src.dtype}")
        if mode is _dge.hwdge:
            s0, sl = src.shape[0], src.shape[-1]
            ok = s0 == 16 if src.ndim == 2 else (s0 in (1, 2, 4, 8, 16) and (s0 * src.shape[-2]) % 16 == 0)
            if not ok or sl > 128:
                fail(f"dma_transpose (hwdge): src shape {list(src.shape)} breaks the hardware DGE rules "
                     "(2-D: shape[0] == 16; 3-D/4-D: shape[0] in {1,2,4,8,16} and shape[0]*shape[-2] "
                     "% 16 == 0; shape[-1] <= 128)")
    _check_dge("dma_transpose", mode, dst, src)
    dma_engine.transpose(dst.core(), src.core(), ax, oob=oob.name, name=name, attrs=_attrs(mode, src))


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=None, name=""):
    """``dst = sum(srcs)`` through the DMA engines (``nl.add`` only, scales 1.0)."""
    require_kernel("nisa.dma_compute")
    dst = tile(dst, "dma_compute", "dst")
    srcs = [tile(s, "dma_compute", f"srcs[{i}]") for i, s in enumerate(srcs)]
    if alu_name(reduce_op, "nisa.dma_compute reduce_op") != "add":
        fail("dma_compute: reduce_op must be nl.add")
    if scales is not None and any(float(s) != 1.0 for s in scales):
        fail(f"dma_compute: scales must all be 1.0; got {list(scales)}")
    oob = member(_oob, oob_mode, "oob_mode", _oob.error)
    for i, s in enumerate([dst] + srcs):
        buffer_in("dma_compute " + ("dst" if i == 0 else f"srcs[{i - 1}]"), s, ("hbm", "sbuf"))
        same_elements("dma_compute", dst, s)
    if any(_vector(v) for v in [dst] + srcs):
        if len(srcs) != 2:
            fail(f"dma_compute with vector_offset needs exactly 2 sources; got {len(srcs)}")
        if not unique_indices:
            fail("dma_compute with vector_offset needs unique_indices=True")
    cores = [s.core() for s in srcs]
    dma_engine.compute_sum(dst.core(), cores, scales, oob=oob.name, name=name)

