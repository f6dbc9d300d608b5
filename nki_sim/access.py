"""Checked reads and writes of tensor views (the memory model's single entry point).

Every read / write of kernel-visible memory goes through :func:`read` / :func:`write`
(``t`` is any :class:`nki_sim.tensor.Tensor` view, of any front end's subclass):
bounds (static and indirect, honouring ``mask=`` and ``oob_mode``), uninitialized reads
(written bitmap), immutable parameters, the ``affine_range`` dependency checker
(per-element write/read epochs) and dtype casting on write.  Compute code never indexes
``Alloc.data`` itself.
"""

from __future__ import annotations

import warnings

import numpy as np

from . import deps
from . import dtypes as D
from . import errors as E
from .config import config
from .indexing import broadcast_left
from .positions import Access  # noqa: F401  (re-exported: the access of a view)
from .memory import touch
from .state import state


# ---------------------------------------------------------------------------- checks
def _uninit(t: Tensor, acc: Access, op: str):
    """Report never-written elements read by ``acc``; memory whose poison fill is still pending
    (``Alloc.lazy_poison``) is poisoned first whenever the access touches unwritten elements."""
    alloc = t.alloc
    w = alloc.written
    if w is None:
        return
    wv = acc.gather(w)
    if wv.all():
        return
    if alloc.lazy_poison:
        alloc.poison()
    if config.uninitialized == "ignore":
        return
    bad = ~wv if acc.valid is None else (~wv & acc.valid)
    if bad.any():
        uninitialized(t, ~bad, op)


def uninitialized(t: Tensor, written_mask, op: str):
    """Report a read of the never-written elements (``~written_mask``) of ``t``."""
    bad = ~np.asarray(written_mask, dtype=bool)
    n = int(np.count_nonzero(bad))
    first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad.reshape(-1))), bad.shape))
    msg = (f"'{op}' reads {n} never-written element(s) of tensor {t.name} "
           f"({t.buffer} {list(t.shape)} {t.dtype.name}); first at index {list(first)} of the access")
    if config.uninitialized == "warn":
        warnings.warn(msg, RuntimeWarning, stacklevel=4)
    elif config.uninitialized == "raise":
        raise E.UninitializedReadError(msg)


def check_initialized(t: Tensor, mask, op: str):
    _uninit(t, Access(t, mask), op)


def _scope(t: Tensor, op: str):
    f = t.alloc.scope
    if f is not None and not f.alive and config.check_scope:
        raise E.NkiCompileError(
            f"'{op}' uses tensor {t.name} outside the scope it was created in: it was allocated "
            f"inside the nl.{f.kind}_range loop at {f.src[0].split('/')[-1]}:{f.src[1]}, which has "
            "ended (err_local_variable_used_out_of_scope); allocate it before the loop",
            code="err_local_variable_used_out_of_scope")


# ---------------------------------------------------------------------------- read / write
def read(t: Tensor, mask=None, *, op: str = "read", oob: str = "error"):
    """Checked read of a view: returns (values in storage dtype, Access)."""
    alloc = t.alloc
    sc = alloc.scope
    if sc is not None and not sc.alive:
        _scope(t, op)
    if alloc.rec is not None:
        touch(alloc)
    acc = Access(t, mask, oob)
    if alloc.written is not None:
        _uninit(t, acc, op)
    vals = acc.gather(alloc.data)
    k = state.kernel
    if k is not None and k.affine:
        frames = deps.frames_for(alloc, k)
        if frames:
            lo = frames[0].loop_start            # no epoch below this can be in any window
            if alloc.wmax >= lo:
                deps.check(alloc.wlog, t, acc, frames, "reads", op)
            if alloc.kind != "input" or alloc.mutable:
                epoch = state.epoch
                if alloc.rlog is None:
                    alloc.rlog = deps.EpochLog()
                deps.record(alloc.rlog, t, acc, epoch, k)
                alloc.rmax = epoch
    return vals, acc


def read_values(t: Tensor, mask=None, op: str = "read") -> np.ndarray:
    return read(t, mask, op=op)[0]


def read_index_tile(k: Tensor) -> np.ndarray:
    """Values of an indirect-DMA index tile (must be an integer SBUF tile)."""
    if k.buffer != "sbuf":
        raise E.MemorySpaceError(
            f"indirect DMA index tensor {k.name} is in {k.buffer}; indices have to be in SBUF "
            "(load them with nl.load or build them with nisa.iota)")
    if k.dtype.kind not in "iu":
        raise E.DtypeError(f"indirect DMA index tensor {k.name} must be an integer tile; got {k.dtype.name}")
    return np.asarray(read_values(k, op="indirect index"), dtype=np.int64)


def fit_value(values, shape, dst_name="dst", src_name="value") -> np.ndarray:
    """Broadcast a value to a destination shape (left-aligned tiles, then NumPy rule)."""
    v = values if type(values) is np.ndarray else np.asarray(values)
    if v.shape == shape:
        return v
    shape = tuple(shape)
    if v.shape == shape:
        return v
    try:
        return broadcast_left(v, shape)
    except ValueError:
        pass
    try:
        return np.broadcast_to(v, shape)
    except ValueError:
        raise E.ShapeError(
            f"Illegal assignment destination shape in 'a = b': shape {list(shape)} of parameter "
            f"'a' is smaller than other parameter shapes b{list(v.shape)}. ({dst_name} = {src_name})"
        ) from None


def write(t: Tensor, values, mask=None, *, op: str = "write", oob: str = "error",
          accumulate: bool = False, exempt: bool = False) -> Access:
    """Checked write (cast to the destination dtype) of ``values`` into view ``t``."""
    alloc = t.alloc
    if alloc.kind == "input" and not alloc.mutable:
        raise E.ImmutableParameterError(
            f"Cannot update immutable parameter '{alloc.name}' ('{op}'); annotate it as "
            f"{alloc.name}: nt.mutable_tensor and return it (err_cannot_update_immutable_parameter)")
    sc = alloc.scope
    if sc is not None and not sc.alive:
        _scope(t, op)
    if alloc.rec is not None:
        touch(alloc)
    acc = Access(t, mask, oob)
    if type(values) is np.ndarray and values.shape == t.shape:
        vals = values
    else:
        vals = fit_value(values, t.shape, t.name)
    if not exempt:
        k = state.kernel
        if k is not None and k.affine:
            frames = deps.frames_for(alloc, k)
            if frames:
                lo = frames[0].loop_start
                if alloc.wmax >= lo:
                    deps.check(alloc.wlog, t, acc, frames, "writes", op)
                if alloc.rmax >= lo:
                    deps.check(alloc.rlog, t, acc, frames, "writes", op, "read")
                epoch = state.epoch
                if alloc.wlog is None:
                    alloc.wlog = deps.EpochLog()
                deps.record(alloc.wlog, t, acc, epoch, k)
                alloc.wmax = epoch
    if accumulate == "rmw":
        _rmw_add(acc, vals)
        if alloc.written is not None:
            _mark_written(alloc, acc)
        alloc.ever_written = True
        return acc
    if accumulate:
        cur = np.asarray(acc.gather(alloc.data), dtype=np.float32)
        if alloc.written is not None:
            cur = np.where(acc.gather(alloc.written), cur, np.float32(0))
        vals = cur + np.asarray(vals, dtype=np.float32)
    if not D.plain_cast(vals.dtype, alloc.dtype):
        vals = D.cast_for_write(vals, alloc.dtype)
    acc.scatter(alloc.data, vals)         # float -> float casts happen in the copy (unsafe = RNE)
    if alloc.written is not None:
        _mark_written(alloc, acc)
    alloc.ever_written = True
    return acc


def _mark_written(alloc, acc: Access) -> None:
    """Set the written bits of ``acc``; a fully initialised allocation drops its bitmap (later
    reads skip the check).  ``alloc.unwritten`` counts the clear bits, updated per region."""
    w = alloc.written
    if not acc.adv:
        region = acc.gather(w)
        valid = acc.valid
        if valid is None:
            new = region.size - np.count_nonzero(region)
            if new:
                region[...] = True
        else:
            new = np.count_nonzero(valid & ~region)
            if new:
                np.copyto(region, True, where=valid)
        alloc.unwritten -= new
    else:                         # index arrays may repeat an element: recount
        acc.scatter(w, True)
        alloc.unwritten = w.size - np.count_nonzero(w)
    if not alloc.unwritten:
        alloc.written = None
        alloc.lazy_poison = False


def _rmw_add(acc: Access, vals) -> None:
    """dst[i] += v for every element, accumulating duplicate destinations (DMA dst_rmw_op=add)."""
    t = acc.t
    alloc = t.alloc
    offs = acc.offs if acc.offs is not None else t.flat_offsets()
    v = np.broadcast_to(vals, t.shape)
    if acc.valid is not None:
        offs, v = offs[acc.valid], v[acc.valid]
    offs, v = offs.reshape(-1), v.reshape(-1)
    cdt = np.int64 if (D.is_int(alloc.dtype) and D.is_int(np.asarray(vals).dtype)) else np.float32
    u, inv = np.unique(offs, return_inverse=True)
    sums = np.zeros(u.shape, cdt)
    np.add.at(sums, inv, v.astype(cdt))
    flat = alloc.data.reshape(-1)
    flat[u] = D.cast_for_write(flat[u].astype(cdt) + sums, alloc.dtype)
