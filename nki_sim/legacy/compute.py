"""Shared plumbing of compute instructions: operand reads, result tiles, events, checks.

Compute code gets NumPy arrays from :func:`operand` (a checked read through
:mod:`nki_sim.access`), computes, and hands the result to :func:`result_tile`, which
allocates the fresh output tile (SBUF unless stated), writes it with the cast to the
output dtype (masked elements only) and records the trace event (the engine layer's
:func:`~nki_sim.engines.events.emit_compute`, so the same instruction records the same event
in either front end).
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as D
from .. import errors as E
from ..access import Access, read, uninitialized
from ..engines.events import Operand, emit_compute, free_size  # noqa: F401  (the event contract)
from ..indexing import IndexExpr, MaskExpr, broadcast_left, mask_array
from ..memory import Alloc
from ..state import state
from ..target import get_target
from ..tensor import Tensor


# ``state.implied`` (per thread): masks implied by reading a masked op result (a fresh tile
# some of whose elements were never written) without a mask of one's own: the output elements
# computed from unwritten input elements stay unwritten ("poison propagates"), instead of
# raising at the read.


def require_kernel(api: str):
    s = state
    if s.implied:
        s.implied.clear()     # every instruction starts here
    if s.kernel is None:
        raise E.NkiCompileError(
            f"'{api}' called outside of an NKI kernel; call it from a function run by nki.jit / "
            "nki.simulate_kernel (err_nki_api_outside_of_nki_kernel)",
            code="err_nki_api_outside_of_nki_kernel")


def mask_for_input(mask, shape):
    """Reduce an op mask (on the output grid) to an input's shape (left-aligned), or None."""
    if mask is None:
        return None
    shape = tuple(shape)
    if mask.shape == shape:
        return mask
    m, r = mask, len(shape)
    if m.ndim > r:
        m = m.any(axis=tuple(range(r, m.ndim)))
    elif m.ndim < r:
        m = m.reshape(m.shape + (1,) * (r - m.ndim))
    for ax in range(r):
        if shape[ax] == 1 and m.shape[ax] > 1:
            m = m.any(axis=ax, keepdims=True)
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        return None


def operand(x, name: str, op: str, mask=None, *, allow_hbm=False, allow_psum=True,
            allow_scalar=True, require_sbuf=False) -> Operand:
    """Checked read of an instruction operand (tile view or scalar)."""
    if isinstance(x, Tensor):
        buf = x.alloc.buffer
        if buf == "sbuf" and not x.pax and x.indirect is None:     # the common case
            m = None if mask is None else mask_for_input(mask, x.shape)
            if m is None and x.alloc.temp and x.alloc.written is not None:
                m = _implied_mask(x)
            v, _ = read(x, m, op=op)
            return Operand(v, x.arr.dtype, x.shape, buf, x)
        if x.is_hbm and not allow_hbm:
            raise E.MemorySpaceError(
                f"Expected operand '{name}' of '{op}' to be in address space 'sbuf'"
                f"{'' if require_sbuf or not allow_psum else ' or psum'}, but got a tile in "
                f"'{x.buffer}' instead. Load it into SBUF with nl.load first.")
        if x.buffer == "psum" and (require_sbuf or not allow_psum):
            raise E.MemorySpaceError(
                f"Expected operand '{name}' of '{op}' to be in address space 'sbuf', but got a "
                f"tile in 'psum' instead.")
        if x.pax:
            raise E.NkiCompileError(
                f"operand '{name}' of '{op}' is tensor {x.name} {list(x.shape)} whose partition "
                f"dimension is axis {x.pax}, not a tile; index its block dimension(s) first "
                "(err_failed_to_infer_tile_from_local_tensor)",
                code="err_failed_to_infer_tile_from_local_tensor")
        if x.indirect is not None:
            raise E.IndexingError(
                f"operand '{name}' of '{op}' uses a dynamic index tensor; indirect indices are only "
                "supported by nl.load / nl.store / nisa.dma_copy "
                "(err_copy_dynamic_indirect_indices_not_natively_supported)",
                code="err_copy_dynamic_indirect_indices_not_natively_supported")
        m = mask_for_input(mask, x.shape)
        if m is None and x.alloc.temp and x.alloc.written is not None:
            m = _implied_mask(x)
        v, _ = read(x, m, op=op)
        return Operand(v, x.dtype, x.shape, x.buffer, x)
    if isinstance(x, (IndexExpr, MaskExpr)):
        raise TypeError(f"operand '{name}' of '{op}' is an nl.arange / nl.mgrid index expression; "
                        "materialize it with nisa.iota first")
    if allow_scalar and isinstance(x, (bool, int, float, np.number, np.bool_)):
        d = D.scalar_dtype(x)
        return Operand(np.asarray(x), d, (), "", None)
    if isinstance(x, np.ndarray):
        raise TypeError(f"operand '{name}' of '{op}' is a NumPy array; kernel inputs must be passed "
                        "as kernel arguments (HBM) and loaded with nl.load")
    if getattr(x, "nki_loop_reduce", False):
        raise TypeError(f"operand '{name}' of '{op}' is the result of nl.loop_reduce, which must be "
                        "assigned into its accumulator tile first (acc[...] = nl.loop_reduce(x, ...))")
    raise TypeError(f"operand '{name}' of '{op}' must be a tile{' or a scalar' if allow_scalar else ''}; "
                    f"got {type(x).__name__}")


def _implied_mask(x: Tensor):
    """Written-element mask of a partially written op result ``x`` (recorded in
    ``state.implied`` for the output), or None when it is fully written."""
    wm = Access(x).gather(x.alloc.written)
    if wm.all():
        return None
    m = np.array(wm, dtype=bool)
    state.implied.append((x, m))
    return m


def check_partitions(shape, what: str):
    if not shape or shape[0] <= 128:          # every target has at least 128 partitions
        return
    pmax = get_target().pmax
    if shape[0] > pmax:
        raise E.PartitionLimitError(
            f"number of partitions {shape[0]} exceed architecture limitation of {pmax}. "
            f"({what}; Size of partition dimension {shape[0]} exceeds architecture limitation of {pmax}.)")


def check_same_partitions(op: str, named):
    """named: list of (name, shape) of tile operands that must have equal partition counts."""
    tiles = [(n, s) for n, s in named if s]
    ps = {s[0] for _, s in tiles}
    if len(ps) > 1:
        desc = ", ".join(f"{n}{list(s)}" for n, s in tiles)
        raise E.PartitionMismatchError(
            f"number of partitions (dimension 0 size of a tile) mismatch in parameters ({desc}) of '{op}'")


def result_tile(values, dtype, *, op: str, engine: str, inputs=(), mask=None, shape=None,
                buffer: str = "sbuf", name: str = "", fresh=True, free_elems=None,
                attrs=None, emit=True, isa=None) -> Tensor:
    """Allocate the output tile of an instruction, write ``values`` (cast), record the event.

    ``op`` names the API call (messages, ``producer``); ``isa`` the engine instruction it lowers
    to, the event's op (default ``op``): ``nl.add`` of two tiles records ``tensor_tensor`` as
    ``nisa.tensor_tensor`` and the current API's ``nl.add`` do."""
    d = dtype if type(dtype) is np.dtype else np.dtype(dtype)
    v = values if type(values) is np.ndarray else np.asarray(values)
    shape = v.shape if shape is None else tuple(shape)
    if shape and shape[0] > 128:
        check_partitions(shape, f"output of '{op}'")
    if v.shape != shape:
        v = broadcast_left(v, shape)
    plain = D.plain_cast(v.dtype, d)
    data = v if plain else D.cast_for_write(v, d)
    m = None
    if mask is not None:
        m = mask if isinstance(mask, np.ndarray) else mask_array(mask, shape)
        if m is not None and m.shape != shape:
            m = broadcast_left(m, shape)
    if state.implied:
        m = _propagate(m, shape, op)
    if m is None:
        if data.dtype != d or data.base is not None or not data.flags.c_contiguous \
                or not data.flags.owndata:
            out = np.empty(shape, dtype=d)
            np.copyto(out, data, casting="unsafe")      # the plain float cast, in the copy
            data = out
        alloc = Alloc(data, buffer, name=name, written=True)
    else:
        full = np.full(shape, D.poison_value(d), dtype=d)
        np.copyto(full, data, casting="unsafe", where=m)
        alloc = Alloc(full, buffer, name=name, written=np.array(m, dtype=bool, copy=True, order="C"))
    alloc.temp = True
    t = state.kernel.tensor_type(alloc, alloc.data)     # the launch's tensor type
    t.fresh = fresh
    t.producer = (engine, op)
    t.pmask = None if m is None else alloc.written
    if emit and state.traces:
        emit_compute(engine, isa or op, inputs, t, name=name, free_elems=free_elems, attrs=attrs,
                     count=None if m is None else int(np.count_nonzero(m)))
    return t


def _propagate(m, shape, op):
    """Combine the explicit output mask with the masks implied by partially written inputs."""
    items = state.implied
    state.implied = []
    for x, pm in items:
        if pm.all():
            continue
        try:
            pmb = broadcast_left(pm, shape)
        except ValueError:
            if len(shape) >= 1 and pm.shape[0] == shape[0] and free_size(shape) == 1:
                pmb = broadcast_left(pm.reshape(pm.shape[0], -1).all(axis=1), shape)   # per-row reduction
            else:
                uninitialized(x, pm, op)
                continue
        m = pmb.copy() if m is None else (m & pmb)
    return m
