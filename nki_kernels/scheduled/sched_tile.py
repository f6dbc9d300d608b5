"""The KV tile of one scheduled-kernel item (``nki_kernels.scheduled.scheduled_attention``): its K / V
row gathers (cache rows and, for partial items, overlay rows) and its K^T.

Device code on the op layer (:mod:`nki_kernels.ops`; every function takes it first). ``cfg`` is
the kernel's ``scheduled_attention.SchedConfig`` (``d``, ``nd``, ``kd`` the kernel dtype,
``fp8_direct``), ``phase`` the phase's ``scheduled_attention.Phase`` (``geo`` its
``contract.TileGeometry``: ``bp`` tokens per row, ``nL`` 128-row loads per tile, ``W`` keys per
tile; ``kv`` its ``sched_config.CacheRows``: the cache as gather tables whose row ids name
``bp`` tokens of one KV head, in either cache layout); ``mi`` the metadata chunk (int32; item
columns from ``ci``: ``kv[l]`` then, masked, ``ov[l]``; docs/layouts.md §16.4); ``head`` the KV
head (a block-KV row holds every head: the head is a column offset).

Tile layout: row p of load l at columns ``[l*bp*d, (l+1)*bp*d)``, token s of that row at
``l*bp*d + s*d``; K^T column ``l*128*bp + s*128 + p`` is that key (tile-local index
``(l*128 + p)*bp + s``). The same in both cache layouts (a block-KV gather moves the row's
``bp`` tokens as ``bp`` pieces of ``d`` elements, ``Hkv*d`` apart in HBM).
"""

from __future__ import annotations

from nki_kernels.contract import PARTITIONS as P
from nki_kernels.ops import dtype_name, itemsize
from nki_kernels.tile_ops import (fill_zero, pe_matmul_transpose_blocks, transpose_bank_cols,
                                  transpose_blocks)




def keys_by_dma(ops, cfg, phase) -> bool:
    """Whether the item's K^T comes straight from indirect DMA transposes (one per 128-row
    load, cache rows then overlay rows: :func:`gather_kv`) instead of gathered K rows and PE
    transposes: a trace-time feature of the API and target (``ops.has_gather_transpose``:
    NeuronCore-v3+, current API), for a cache in the kernel dtype and d <= 128."""
    return (cfg.nd == 1 and not cfg.fp8_direct
            and dtype_name(phase.kv.dtype) == dtype_name(cfg.kd)
            and ops.has_gather_transpose(phase.kv.dtype, cfg.d))


def _gather_cache(ops, phase, kv, dst, mi, col, head):
    """Cache rows ``mi[:, col]`` of K (``kv`` = 0) or V (1), KV head ``head``, into ``dst``
    ``(128, bp*d)`` (out-of-bounds rows skipped)."""
    src = phase.kv
    ops.gather(dst, src.tables[kv], mi, col, lead=src.leads[kv], col0=head * src.head_col,
               tokens=src.tokens, step=src.step)


def gather_kv(ops, cfg, phase, mi, ci, overlay, head, kv_tiles=None):
    """K and V rows of the item's tile (the phase's geometry), ``(128, nL * b' * d)`` each, and
    the overlay rows when they live in tiles of their own: ``(k_rows, v_rows, k_ov, v_ov)``.
    With :func:`keys_by_dma` ``k_rows`` is the tile's K^T ``(d, W)`` instead (column order of
    :func:`transpose_keys`; ``kv_tiles[0]``, the phase's persistent K^T tile: columns no DMA of
    the item writes are only read by masked-away scores), written by one indirect DMA transpose
    per load and per overlay load.

    Cache rows are gathered in the cache dtype (no conversion inside an indirect DMA) into a
    zeroed tile (masked items: rows no DMA writes must be exact zeros; K rows where
    :func:`stale_keys_ok` go to ``kv_tiles[0]``, the phase's K rows tile, zeroed once; K and V
    where :func:`nested_tiles` to ``kv_tiles``, zeroed once per head and part) or
    ``kv_tiles``, the phase's persistent tiles (full items write every row). A 16-bit cache (or any cache of the
    kernel dtype) is used as gathered and the overlay rows land in the same tile (``k_ov = v_ov
    = None``).

    fp8 caches with a 16-bit kernel dtype (``cfg.fp8_direct``): the fp8 rows are TensorE
    operands as they are (K through identity matmuls, V in the PV matmul), so no engine converts
    them; the overlay rows (kernel dtype: new tokens are not quantized) go to zeroed tiles of
    their own, ``k_ov`` / ``v_ov``, that TensorE adds in (each tile is zero where the other
    holds a row). Other dtype pairs (an fp8 cache with float32 kernel dtype: TensorE takes
    float32 only with float32) are converted on ScalarE and the overlay rows gathered into the
    converted tile.
    """
    masked, geo, kd = phase.masked, phase.geo, cfg.kd
    nL = geo.nL
    rw = geo.bp * cfg.d
    src = phase.kv
    cdt = src.dtype
    direct = cfg.fp8_direct
    k_ov = v_ov = None
    fresh = masked and not nested_tiles(cfg, phase)     # tiles zeroed for this item
    if keys_by_dma(ops, cfg, phase):
        k_t = kv_tiles[0]       # persistent (masked items: see scheduled_attention.phase_tiles)
        # ScalarE has no K^T PSUM copies on this path: it zeroes two thirds of V and GpSimd
        # the rest, off the busier VectorE (V_ZERO_ENGINES)
        v_rows = zeroed(ops, (P, nL * rw), cdt, V_ZERO_ENGINES) if fresh else kv_tiles[1]
        for l in ops.static_range(nL):
            ops.gather_transpose(k_t, src.tables[0], mi, ci + l, tokens=geo.bp, width=cfg.d,
                                 lead=src.leads[0], col0=l * P * geo.bp, step=src.step,
                                 src_col0=head * src.head_col)
            _gather_cache(ops, phase, 1, v_rows[:, ops.ds(l * rw, rw)], mi, ci + l, head)
            if masked:
                ops.gather_transpose(k_t, overlay, mi, ci + nL + l, tokens=geo.bp,
                                     width=cfg.d, lead=(0,), col0=l * P * geo.bp)
                ops.gather(v_rows[:, ops.ds(l * rw, rw)], overlay, mi, ci + nL + l, lead=(1,))
        return k_t, v_rows, None, None
    if fresh:
        k_rows = (kv_tiles[0] if stale_keys_ok(ops, cfg, phase)
                  else zeroed(ops, (P, nL * rw), cdt, "gpsimd"))
        v_rows = zeroed(ops, (P, nL * rw), cdt, "gpsimd")
        if direct:
            k_ov = zeroed(ops, (P, nL * rw), kd, "gpsimd")
            v_ov = zeroed(ops, (P, nL * rw), kd, "gpsimd")
    else:
        k_rows, v_rows = kv_tiles
    same = dtype_name(overlay.dtype) == dtype_name(cdt)
    for l in ops.static_range(nL):
        _gather_cache(ops, phase, 0, k_rows[:, ops.ds(l * rw, rw)], mi, ci + l, head)
        _gather_cache(ops, phase, 1, v_rows[:, ops.ds(l * rw, rw)], mi, ci + l, head)
        if masked and (same or direct):
            _gather_overlay(ops, k_ov if direct else k_rows, v_ov if direct else v_rows, overlay,
                            mi, ci + nL + l, l * rw, rw)
    if not direct and dtype_name(cdt) != dtype_name(kd):
        k_conv = ops.sbuf((P, nL * rw), kd)
        ops.copy(k_conv, k_rows, engine="scalar")
        v_conv = ops.sbuf((P, nL * rw), kd)
        ops.copy(v_conv, v_rows, engine="scalar")
        k_rows, v_rows = k_conv, v_conv
        if masked and not same:      # overlay rows in the kernel dtype (fp8 cache)
            for l in ops.static_range(nL):
                _gather_overlay(ops, k_rows, v_rows, overlay, mi, ci + nL + l, l * rw, rw)
    return k_rows, v_rows, k_ov, v_ov


def nested_tiles(cfg, phase) -> bool:
    """Whether a masked phase keeps one K and one V tile per KV head and item part, zeroed once
    (``scheduled_attention.phase_tiles``), instead of zeroing them before every item: the
    host's promise ``SchedOptions.nested_rows`` (each real item writes every row an earlier one
    wrote, so a row an item does not write still holds the fill's zeros), for a cache in the
    kernel dtype (fp8 and converted caches keep their per-item tiles)."""
    return (phase.masked and cfg.opts.nested_rows and not cfg.fp8_direct
            and dtype_name(phase.kv.dtype) == dtype_name(cfg.kd))


def stale_keys_ok(ops, cfg, phase) -> bool:
    """Whether a masked item's K rows that no DMA writes may keep what the tile held before
    (NaN possibly, from another sequence) instead of being zeroed per item -- the phase then
    keeps one K rows tile, zeroed once (``scheduled_attention.phase_tiles``): keys-on-partitions steps
    (their masks are selects, ``sched_decode``) on NeuronCore-v3 on, whose PE transposes are
    bit-accurate (NeuronCore-v2's spread a NaN / Inf along the transposed row: every key of its
    128-key block and channel), with K transposed by ``nc_transpose`` (an fp8 cache used
    directly goes through identity matmuls, in which ``NaN * 0`` spreads alike). A stale row
    then reaches only its own key's score (QK contracts over channels), a key no row of the item
    sees, and the select replaces it before the max and the exponentials."""
    return phase.keys_on_partitions and ops.nc_gen() != "gen2" and not cfg.fp8_direct


def zeroed(ops, shape, dtype, engine):
    """A new SBUF tile of zeros (``tile_ops.fill_zero`` on ``engine``). A tuple of k engine
    names shares one fill: each name zeroes 1/k of the columns, in order, and a name repeated
    next to itself is one fill of its shares (``("scalar", "scalar", "gpsimd")``: the first two
    thirds on ScalarE, the rest on GpSimd; cuts on 64-column boundaries where the tile is that
    wide). A 1- or 2-byte tile whose free size fills whole 32-bit words is zeroed as its float32
    view (``ops.filled_as_words``; all-zero bits either way): a half (16-bit) or a quarter
    (fp8) of the elements to write."""
    engines = engine if isinstance(engine, tuple) else (engine,)

    def fill(t):
        n, k = t.shape[1], len(engines)
        align = 64 if n >= 64 * k else 1
        cut = [n * i // k // align * align for i in range(k)] + [n]
        runs = []                                   # (engine, lo, hi), equal neighbours merged
        for e, lo, hi in zip(engines, cut[:-1], cut[1:]):
            if runs and runs[-1][0] == e:
                runs[-1] = (e, runs[-1][1], hi)
            elif hi > lo:
                runs.append((e, lo, hi))
        for e, lo, hi in runs:
            fill_zero(ops, t if hi - lo == n else t[:, ops.ds(lo, hi - lo)], e)

    per_word = 4 // itemsize(dtype)
    if per_word > 1 and shape[1] % per_word == 0:
        return ops.filled_as_words(shape, dtype, fill)
    t = ops.sbuf(shape, dtype)
    fill(t)
    return t


# Engines that zero a masked item's V tile when K^T arrives by DMA transpose (``zeroed``): two
# thirds on ScalarE (no K^T copies on this path), a third on GpSimd, off VectorE. MODELED, trn2
# current API, with the decode masks' compares on GpSimd (sched_decode), half / two thirds on
# ScalarE: 4 x 512 + 60 decodes 6040 / 6040 us, 2 + 30 1834 / 1772, 32 decodes 2513 / 2513
# (three fills, two of them on ScalarE, cost 2 + 30 another 34 us); with the class launches
# added one after the other (nki_sim.cost): 8261 / 8261, 2117 / 2091, 2513 / 2513 (all on
# ScalarE: 8253, 2087, 2509 -- within 0.2 %, not taken). In the mixed batches' pair launch
# (one launch, ScalarE busy with the prefill items too): half / all on ScalarE 6084 / 6243 us
# (4 x 512 + 60), 1829 / 1907 (2 + 30), against 6084 and 1773 with two thirds. Items whose rows
# nest (nested_tiles: the benchmark's decode classes but 4 x 512 + 60's) fill nothing per item.
V_ZERO_ENGINES = ("scalar", "scalar", "gpsimd")


# PSUM -> SBUF copy engines of the K^T PE transposes of a keys-on-partitions (decode) class on
# NeuronCore-v3 (the legacy API), cycled over each load's copies: one in four on VectorE.
# ScalarE carries the rest and the decode steps' exponentials; VectorE only the decode steps'
# small operations, so the class's two engines come closer (MODELED, block 32: 32 decodes 2K-8K
# trn2 legacy 2811 -> 2680 us; 4 x 512 + 60 decodes trn2 legacy 9783 -> 9036; one in two was
# slower). On NeuronCore-v2 every copy is on ScalarE: a VectorE copy from PSUM also takes
# VectorE's turn on SBUF, which it shares with GpSimd's V fills (MODELED with the shared ports,
# 4 x 512 + 60 decodes trn1 10396 -> 9644 us). Query-rows classes keep every copy on ScalarE.
K_EVAC_KEYS_ON_PARTITIONS = ("scalar", "scalar", "scalar", "vector")


def transpose_keys(ops, cfg, phase, k_rows, k_ov, eye):
    """K^T of the tile: nd SBUF tiles ``(dk, W)`` in the kernel dtype (channel slice k holds
    channels [128k, 128k + dk); column order of ``sched_core.key_index_tile``). PE transposes of
    the kernel-dtype rows (PSUM copies on :data:`K_EVAC_KEYS_ON_PARTITIONS` for a
    keys-on-partitions phase on NeuronCore-v3, else ScalarE), or identity matmuls of the fp8
    rows (``eye``: the identities of the cache dtype and the kernel dtype) plus the overlay rows
    ``k_ov`` when given. With :func:`keys_by_dma` ``k_rows`` already is K^T."""
    if keys_by_dma(ops, cfg, phase):
        return [k_rows]
    geo = phase.geo
    d, nd, bp, nL, kd = cfg.d, cfg.nd, geo.bp, geo.nL, cfg.kd
    rw = bp * d
    fp8 = eye is not None and dtype_name(k_rows.dtype) != dtype_name(kd)
    # a 16-bit PSUM dtype (v3) fits twice the fp32 columns in a bank: half the K^T copies
    bank_cols = transpose_bank_cols(ops, k_rows.dtype)
    evac = "scalar"
    if phase.keys_on_partitions and ops.nc_gen() != "gen2":
        evac = K_EVAC_KEYS_ON_PARTITIONS
    k_t = []
    for k in ops.static_range(nd):
        dk = min(P, d - k * P)
        kt = ops.sbuf((dk, geo.W), kd)
        for l in ops.static_range(nL):
            # one 128-key block per (load, token s): nd == 1 reads b' adjacent d-wide blocks
            col, width, nblk = ((l * rw, d, bp) if nd == 1 else (l * rw + k * P, dk, 1))
            for s in ops.static_range(1 if nd == 1 else bp):
                c0 = col + s * d
                if fp8:
                    parts = [(k_rows, c0, eye[0])]
                    if k_ov is not None:
                        parts.append((k_ov, c0, eye[1]))
                    pe_matmul_transpose_blocks(ops, kt, l * P * bp + s * P, parts, width, nblk,
                                               evac="scalar")
                else:
                    transpose_blocks(ops, kt, l * P * bp + s * P, k_rows, c0, width, nblk,
                                     evac=evac, bank_cols=bank_cols)
        k_t.append(kt)
    return k_t


def _gather_overlay(ops, k_rows, v_rows, overlay, mi, col, c0, rw):
    """Overlay rows of one load into columns ``[c0, c0 + rw)`` (rows not listed are skipped)."""
    ops.gather(k_rows[:, ops.ds(c0, rw)], overlay, mi, col, lead=(0,))
    ops.gather(v_rows[:, ops.ds(c0, rw)], overlay, mi, col, lead=(1,))
