"""NeuronCore-v3 range-select masking of the scheduled kernel's masked query-rows steps.

Device code on the op layer (:mod:`nki_kernels.ops`; every function takes it first), used by
``sched_core.flash_step`` when ``sched_core.mask_form`` is "range" (``ops.has_range_select()``
and a tiled block size b'). A KV tile's K^T is in tiled column order
(``sched_core.key_index_tile``): key ``(l*128 + p)*b' + s`` at column ``l*128*b' + s*128 + p``.
Row q sees tile-local key t iff ``lo_q <= t < hi_q`` (``sched_core.step_bounds``, range form:
integers in fp32). Two forms:

* **natural key order** (:func:`natural_order`: every load of 128*b' keys inside one step):
  the QK matmul reads K^T through :func:`natural_keys`, so the 512 scores of chunk c are the
  keys ``n0 + j`` in order and ONE range select per chunk masks them and takes their row max
  (:func:`range_masked`, ``natural=True``); the caller transposes P back in tiled order;
* **tiled order** (larger b'): one range select per 128-key block, whose keys ``kidx0 + p*b'``
  a row sees form an interval of p: bounds ``(lo - kidx0) / b'``, derived per step from the
  key-index tile or once per item per key offset s (:class:`OffsetBounds`).

Each select is a self-contained reset-reduce (fp32.min where masked, the row max out).
"""

from __future__ import annotations

from dataclasses import dataclass

from nki_kernels.contract import PARTITIONS as P, PSUM_BANK_F32

# Keys of one key block of a tiled-order masked step.
RANGE_BLOCK = P


def natural_order(ops, tiled_block_size, step_keys: int) -> bool:
    """Whether masked query-rows steps of ``step_keys`` keys over a tile of tiled block size
    b' (None: not a gathered tile) take their keys in natural order: NeuronCore-v3
    (``ops.has_range_select()``) with every load of the tile inside one step, ``128 * b' <=
    step_keys``. The outputs equal the tiled order's bit for bit (the same values, the same
    sums in the same order)."""
    bp = tiled_block_size
    return bp is not None and ops.has_range_select() and P * bp <= step_keys


def natural_keys(ops, k_t, bp, n0):
    """``(dk, 512)`` view of a K^T slice in tiled column order holding the tile-local keys
    ``[n0, n0 + 512)`` in natural order (``n0`` a multiple of 512 and, for b' < 4, of 128*b'):
    the QK matmul's moving operand of :func:`natural_order` steps (a strided SBUF read)."""
    if bp == 1:
        return k_t[:, ops.ds(n0, PSUM_BANK_F32)]
    load_keys = P * bp
    if load_keys >= PSUM_BANK_F32:      # one load: p' < 512 / b' from p0, every offset s
        load, r0 = divmod(n0, load_keys)
        return ops.free_view(k_t, ((1, PSUM_BANK_F32 // bp), (P, bp)),
                             col0=load * load_keys + r0 // bp)
    # b' < 4: 512 / (128 b') whole loads, each every p and s
    return ops.free_view(k_t, ((load_keys, PSUM_BANK_F32 // load_keys), (1, P), (P, bp)),
                         col0=n0)


@dataclass(frozen=True)
class OffsetBounds:
    """Tiled-order range-select bounds of one Q block by key offset: ``lo[s]``, ``hi[s]``
    (s < b') are ``(rows, 1)`` fp32 columns ``(lo_q - s) / b'`` and ``(hi_q - s) / b'``
    (:func:`range_offset_bounds`). Row q sees the key ``l*128*b' + p*b' + s`` (K^T column
    ``l*128*b' + s*128 + p``) iff ``lo[s] <= l*128 + p < hi[s]``, so a 128-key block's range
    select takes ``range_start = l*128`` (static) and needs no per-step bound arithmetic."""

    lo: tuple
    hi: tuple


def range_offset_bounds(ops, lo, hi, bp):
    """The :class:`OffsetBounds` columns of n blocks at once: ``lo``, ``hi`` ``(rows, n)`` fp32
    (range form of ``sched_core.step_bounds``) -> two ``(rows, b' * n)`` fp32 tiles, column
    ``s*n + j`` = ``(x_j - s) / b'`` (exact: integers and a power-of-two divisor); 2 b'
    instructions."""
    rows, n = tuple(lo.shape)
    out = []
    for x in (lo, hi):
        t = ops.sbuf((rows, bp * n), ops.float32)
        for s in ops.static_range(bp):
            ops.tensor_scalar(t[:, ops.ds(s * n, n)], x, "subtract", float(s), op1="multiply",
                              operand1=1.0 / bp)
        out.append(t)
    return tuple(out)


def offset_bounds_of(ops, tiles, j, n, bp, rows):
    """Block j's :class:`OffsetBounds` from :func:`range_offset_bounds` tiles of n blocks."""
    lo, hi = tiles
    return OffsetBounds(lo=tuple(lo[0:rows, ops.ds(s * n + j, 1)] for s in range(bp)),
                        hi=tuple(hi[0:rows, ops.ds(s * n + j, 1)] for s in range(bp)))


def range_masked(ops, src, range_bounds, *, k0, rows, soft_cap, natural, kidx=None, bp=None,
                 out=None):
    """Mask one step's score chunks ``src`` (512 columns each, PSUM or SBUF, fp32) and take
    their row maxima.

    ``natural``: chunk c holds the keys ``k0 + 512c + j`` (:func:`natural_keys`); one select
    per chunk with ``range_bounds`` = (lo, hi) ``(rows, 1)`` columns and ``range_start`` =
    the chunk's first key. Otherwise (tiled order) one select per 128-key block i: with
    ``range_bounds`` an :class:`OffsetBounds`, block (l, s) = divmod(k0 / 128 + i, b') takes
    offset s's bounds and ``range_start`` ``l*128``; with (lo, hi) columns the bounds
    ``(lo - kidx0_i) / b'`` come from ``kidx`` (the key-index tile) per step. With a soft-cap
    the chunk is ``tanh(S / cap)`` first.

    Returns the masked scores (one SBUF ``(rows, 512)`` fp32 tile per chunk, or with ``out``, an
    SBUF ``(rows, 512 * chunks)`` fp32 tile, its 512-column slices; fp32.min where a row does
    not see the key) and the ``(rows, n)`` maxima, n = chunks (natural) or 128-key blocks
    (tiled)."""
    f32 = ops.float32
    per = 1 if natural else PSUM_BANK_F32 // RANGE_BLOCK
    width = PSUM_BANK_F32 // per
    n = len(src) * per
    by_offset = isinstance(range_bounds, OffsetBounds)
    if not natural and not by_offset:
        kb = ops.free_view(kidx, ((RANGE_BLOCK, n),), col0=k0)  # key index at p = 0 of block i
        b0, b1 = (ops.sbuf((rows, n), f32) for _ in range(2))
        for dst, x in ((b0, range_bounds[0]), (b1, range_bounds[1])):
            ops.tensor_scalar(dst, kb, "subtract", x, reverse0=True, op1="multiply",
                              operand1=1.0 / bp)
    mx = ops.sbuf((rows, n), f32)
    vals = []
    for c in ops.static_range(len(src)):
        u = src[c]
        if soft_cap is not None:
            capped = ops.sbuf((rows, PSUM_BANK_F32), f32)
            ops.activation(capped, "tanh", u, scale=1.0 / float(soft_cap))
            u = capped
        base, col = ((ops.sbuf((rows, PSUM_BANK_F32), f32), 0) if out is None
                     else (out, c * PSUM_BANK_F32))
        for i4 in ops.static_range(per):
            i = c * per + i4
            dst = base[:, ops.ds(col + i4 * width, width)]
            data = u[:, ops.ds(i4 * width, width)]
            if natural:
                lo, hi, start = range_bounds[0], range_bounds[1], k0 + c * PSUM_BANK_F32
            elif by_offset:     # K^T column block (l, s): range_start l*128, bounds of offset s
                load, s_off = divmod(k0 // RANGE_BLOCK + i, bp)
                lo, hi = range_bounds.lo[s_off], range_bounds.hi[s_off]
                start = load * RANGE_BLOCK
            else:
                lo, hi, start = b0[:, ops.ds(i, 1)], b1[:, ops.ds(i, 1)], 0
            ops.range_select_max(dst, data, lo, hi, mx[:, ops.ds(i, 1)], start=start)
        vals.append(base if out is None else base[:, ops.ds(col, PSUM_BANK_F32)])
    return vals, mx
