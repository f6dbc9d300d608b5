"""Scheduled (block-sparse) flash paged attention: work proportional to what the batch needs.

One source for both NKI APIs (the op layer, :mod:`nki_kernels.ops`): on the legacy API one
program per KV head (grid ``[1, Hkv]``), on the current API one launch looping over the KV heads
(``ops.kv_heads``). ``scheduled_paged_attention.for_api(api)`` is the jitted kernel of an API;
``scheduled_paged_attention[1, Hkv]`` the legacy launch. The host (``host/scheduled/schedule.py``, layouts in ``docs/layouts.md``
"Scheduled kernel") turns a batch into *items*: (Q group, KV tile) pairs of the same sequence,
in two static phases:

* **partial** items (masked): tiles a row of the group sees only in part (the causal diagonal,
  a sequence's last key rows, sliding-window edges; the host may also put whole tiles in the
  phase's padding slots, with bounds that see every key). The mask is built in-kernel from two fp32
  numbers per query row (``|t - c| < r`` over the tile-local key index t), so mask traffic is
  O(query rows), never O(queries x context). The KV tile is zeroed before the gathers, so key
  rows no DMA writes are exact zeros.
* **full** items (no mask work at all): every real row of the group sees every key of the tile
  and every key row comes from the cache.

Each phase is ONE sequential loop (``ops.sequential_range``) over its items (static counts, padded to a geometric
bucket by the host); everything that varies at run time is data: gather rows, Q rows, state /
output rows and a reset flag. A DMA whose row index is out of bounds is skipped
(``oob_mode.skip``), which is how padding items, padding rows and unchanged Q / state move no
bytes: the online-softmax state of the current Q group and its scaled Q stay in SBUF from one
item to the next and are (re)initialised when the reset flag says a new group starts. The
full phase runs first and leaves the state of each group it touched in a private HBM scratch
(one row per query row of the group, every block's ``d + 2`` fp32 o, -m, l side by side: one
DMA per group); the partial phase, where every group ends, starts such a group from that state
and writes the output (one DMA per group). Nothing else goes through HBM.

Each phase has its own tile geometry: full items tiles of ``LARGE_TILE_SZ`` keys, partial items
tiles of ``PARTIAL_TILE_SZ`` keys (the host cuts a large tile that is not full into partial
tiles and schedules only those some row sees), each read through its own flat view of the cache.

An fp8 cache with a 16-bit kernel dtype is never converted on chip: K^T comes from identity
matmuls of the fp8 rows (fp32 PSUM, evacuated into the kernel dtype by the copy every K^T pays)
and V is the PV matmul's fp8 operand; the 16-bit overlay rows of a partial item sit in tiles of
their own that TensorE adds in.

Dimensions (static, from the shapes): Hkv KV heads; d head size (1..512, nd = ceil(d/128)
slices of <= 128 channels); rows query rows per Q block (<= 128); blocks Q blocks per group;
ngroups groups of this launch (nblk = ngroups * blocks Q blocks); B block size; per phase T,
b', nL from its tile size and B (``nki_kernels.contract.tile_geometry``); W = nL * 128 * b'
keys per item.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nki_kernels._assert import kernel_check, kernel_unsupported
from nki_kernels.contract import (M_FLOOR, PARTITIONS as P, Q_INIT_COLUMNS, Q_INIT_SLOPE,
                                  STATE_EXTRA_COLUMNS, chunk_size)
from nki_kernels.ops import KernelFamily, dtype_name
from nki_kernels.scheduled.sched_config import (KERNEL, MAX_D, Chunk, Constants, GroupTiles,  # noqa: F401
                                      Inputs, Phase, SchedConfig, SchedOptions, cache_dims,
                                      configure)
from nki_kernels.scheduled.sched_core import (KVTile, additive_mask_ok, key_index_tile,
                                              mask_eye_tile)
from nki_kernels.scheduled.sched_decode import decode_constants, key_index_columns
from nki_kernels.scheduled.sched_item import (chunk_queries, fold_tile, load_q_slices, load_state,
                                              reset_by_dma, reset_ids, reset_state,
                                              state_reset_table, store_blocks)
from nki_kernels.scheduled.sched_range import natural_order
from nki_kernels.scheduled.sched_tile import (gather_kv, keys_by_dma, nested_tiles,
                                              stale_keys_ok, transpose_keys, zeroed)
from nki_kernels.tile_ops import identity_tile


def _build(ops):
    def scheduled_paged_attention(query_t, q_init, kv_cache, overlay, meta_pi, meta_pf, meta_fi,
                                  meta_ff, blocks, options=SchedOptions(), q_full=None,
                                  q_part=None, i_full=None, i_part=None, bounds_p=None,
                                  value_cache=None):
        """Scheduled paged attention of one class of Q blocks.

        Args:
            query_t: (Hkv * ngroups * d, blocks * rows) float32/bfloat16/float16, group-major
                (docs/layouts.md "Scheduled kernel"): row ``(h*ngroups + g)*d + ch``, columns
                ``[j*rows, (j+1)*rows)`` hold channel ch of the ``rows`` query rows of Q block
                ``g*blocks + j`` of KV head h (Q^T blocks), one gather per channel slice when a
                group starts (query-rows classes).
            q_init: (Hkv * ngroups * rows, blocks * 4) float32, group-major: row
                ``(h*ngroups + g)*rows + r``, columns ``[j*4, j*4 + 4)`` for query row r of
                block j of group g (``contract.Q_INIT_*``): initial -m and l of the online
                softmax (-M_FLOOR, 0 normally; -sink, 1 with an attention sink), the ALiBi slope
                and slope * query position. Read only with ``row_init`` by query-rows classes
                (gathered per group start).
            kv_cache: (2, N, Hkv, B, d) [0] = K, [1] = V (read only): the query dtype, or fp8
                (float8_e4m3 / float8_e5m2; scales are folded in by the host). With
                ``options.kv_layout == "block_kv"``: vLLM's key cache (N, B, Hkv, d) in the
                query dtype, read in place (docs/layouts.md §18).
            overlay: (2, Hkv * R_ov, b'_p * d): key rows that are not whole cached-context rows
                (a sequence's partly filled last context row and its new tokens); row
                ``h * R_ov + r``. The kv_cache dtype, or for an fp8 cache the kernel dtype.
            meta_pi, meta_pf: partial-phase metadata, (Hkv, 128, Ip * ki) int32 and
                (128, Ip * kf) float32 (``host.scheduled.schedule.PhaseArrays``; Ip items, may be 0).
            meta_fi, meta_ff: full-phase metadata, (Hkv, 128, If * ki') int32, (128, If * kf').
            blocks: Q blocks per group (a static int; the rows per Q block, 1..128, are
                ``query_t.shape[1] // blocks``).
            options: :class:`SchedOptions`.
            q_full, q_part: decode-layout classes (``contract.decode_layout``) only, else None
                (not read): the Q^T of every item of the full / partial phase, (Hkv * d,
                items * rows) in query_t's dtype, column ``t*rows + r`` = row r of item t's block
                for KV head ``row // d``; preloaded with each chunk's metadata.
            i_full, i_part: decode-layout classes with ``options.row_init`` only, else None (not
                read): the ``q_init`` rows of every item of the full / partial phase, (Hkv * rows,
                items * 4) float32, row ``h*rows + p``, columns ``[t*4, t*4 + 4)`` for query row
                p of item t (``host.scheduled.scheduled.item_row_init``).
            bounds_p: decode-layout classes only, else None (not read): (1, Ip * 2 * rows)
                float32, item t's mask bounds (``c_q`` then ``r_q``; row q sees tile-local key t
                iff ``|t - c_q| < r_q``) on ONE partition, broadcast in-kernel.
            value_cache: ``kv_layout == "block_kv"``: vLLM's value cache (N, B, Hkv, d), the
                key cache's shape and dtype, read in place; otherwise None.

        Returns:
            (Hkv * ngroups * rows, blocks * d) in query_t.dtype, group-major: row
            ``(h*ngroups + g)*rows + r``, columns ``[j*d, (j+1)*d)`` = output of query row r of
            Q block ``g*blocks + j`` of KV head h (one store per group; rows no block of a group
            holds are left unwritten, and the host never reads padding rows).

        Raises:
            ValueError: a bad input (named), including an input the class needs left None.
            NotImplementedError: a cache dtype that is neither the query's nor fp8, or a
                toolchain without out-of-bounds DMA skipping.
        """
        # the output is created here: shared-HBM outputs only at the kernel's top level
        out = ops.ndarray(output_shape(query_t, kv_cache, value_cache, blocks, options),
                          dtype=query_t.dtype, buffer=ops.SHARED_HBM)
        cfg, ins, Hkv = class_setup(ops, query_t, q_init, kv_cache, overlay,
                                    (meta_pi, meta_pf, meta_fi, meta_ff), blocks, options,
                                    (q_full, q_part, i_full, i_part, bounds_p), value_cache, out)
        scheduled_body(ops, cfg, ins, Hkv)
        return out

    return scheduled_paged_attention


def output_shape(query_t, kv_cache, value_cache, blocks, options) -> tuple:
    """The class's output shape ``(Hkv * ngroups * rows, blocks * d)``, its inputs' shapes
    checked (``blocks``, ``query_t.shape``)."""
    _, _, Hkv, d = cache_dims(kv_cache, value_cache, options)
    kernel_check(isinstance(blocks, int) and blocks >= 1, KERNEL, "blocks",
                 "be an int >= 1", blocks)
    kernel_check(len(query_t.shape) == 2 and query_t.shape[0] % max(Hkv * d, 1) == 0
                 and query_t.shape[1] % blocks == 0, KERNEL, "query_t.shape",
                 f"be (Hkv*ngroups*d, blocks*rows) with Hkv*d = {Hkv * d}, blocks = {blocks}",
                 tuple(query_t.shape))
    ngroups, rows = query_t.shape[0] // (Hkv * d), query_t.shape[1] // blocks
    return (Hkv * ngroups * rows, blocks * d)


def class_setup(ops, query_t, q_init, kv_cache, overlay, metas, blocks, options, items,
                value_cache, out):
    """One class's state scratch and checked configuration: ``(cfg, ins, Hkv)``.

    ``metas`` = (meta_pi, meta_pf, meta_fi, meta_ff), ``items`` = (q_full, q_part, i_full,
    i_part, bounds_p); every input as :func:`scheduled_paged_attention` documents it; ``out``
    the class's output (:func:`output_shape`, the query dtype, shared HBM)."""
    meta_pi, meta_pf, meta_fi, meta_ff = metas
    q_full, q_part, i_full, i_part, bounds_p = items
    _, _, Hkv, d = cache_dims(kv_cache, value_cache, options)
    ngroups, rows = query_t.shape[0] // (Hkv * d), query_t.shape[1] // blocks
    # one slab per physical core (contract.MAX_LAUNCH_CORES): the cores never share rows
    state = ops.ndarray((ops.launch_core()[1], max(ngroups * rows, 1),
                         blocks * (d + STATE_EXTRA_COLUMNS)),
                        dtype=ops.float32, buffer=ops.PRIVATE_HBM)
    ins = Inputs(query_t=query_t, q_items=(q_full, q_part), i_items=(i_full, i_part),
                 bounds_p=bounds_p, q_init=q_init, overlay=overlay,
                 meta_i=(meta_fi, meta_pi), meta_f=(meta_ff, meta_pf), out=out, state=state)
    cfg = configure(ops, ins, kv_cache, rows, blocks, options, value_cache)
    return cfg, ins, Hkv


scheduled_paged_attention = KernelFamily(_build, KERNEL)


def scheduled_body(ops, cfg: SchedConfig, ins: Inputs, num_kv_heads: int):
    """Body of :func:`scheduled_paged_attention` for the KV heads of this program.

    Pseudocode (per KV head h; full phase first, then the partial phase):
        for item t in sequential_range(items):            # chunks of metadata preloaded
            Q^T <- query_t rows q[t]; [row_init] init <- q_init rows ini[t]
                                                          (keys on partitions: item t's
                                                          preloaded i_full / i_part columns)
                                                          (skipped unless a group starts here)
            if reset[t]: st = init for every row          (select, NaN-safe; or, where
                                                          sched_item.reset_by_dma says so, a DMA
                                                          from the initial table, skipped unless
                                                          a group starts, then the q_init rows
                                                          straight into st)
            [partial] st <- state rows st[t]  (skipped unless the group starts here and had
                                               full items)
            K, V <- kv rows kv[t] (+ overlay rows ov[t], partial phase; tile zeroed first)
            K^T by PE transposes (per 128-channel slice)
            for each block j, each <= 2048-key step: flash_step(Q^T_j, K^T, V, st_j [, mask])
            [full] state rows st[t] <- st     (skipped unless this is the group's last full
                                               item and the host does not keep the group's
                                               state in SBUF for the partial phase)
            [partial] out rows out[t] <- o / max(l, L_FLOOR)  (skipped unless the group ends)
    """
    require_oob_skip(ops)
    const = None
    parts = cfg.opts.item_parts
    part = ops.item_part(num_kv_heads, parts)
    for head in ops.kv_heads(num_kv_heads, parts):
        tiles = group_tiles(ops, cfg, ins.query_t.dtype)
        if const is None:         # once per kernel, after the first head's tiles
            const = constants(ops, cfg, tiles.init, num_kv_heads)
        for phase in (cfg.full, cfg.partial):
            if phase.items:
                run = PhaseRun(cfg, ins, phase, head, tiles, const, phase_tiles(ops, cfg, phase))
                n = part_items(cfg, phase)
                run_items(ops, run, part * n, n)


def require_oob_skip(ops):
    """NotImplementedError on a toolchain without indirect-DMA out-of-bounds skipping (every
    padding item, row and unchanged state of the scheduled kernels is a skipped DMA)."""
    kernel_unsupported(ops.has_oob_skip(), KERNEL,
                       "this NKI toolchain (nki.isa has no oob_mode: indirect-DMA out-of-bounds "
                       "skipping needs neuronx-cc from Neuron SDK 2.23)",
                       "upgrade to Neuron SDK >= 2.23")


def group_tiles(ops, cfg, q_dtype):
    """A class's per-head SBUF tiles: state, initial state, ALiBi columns, raw Q^T slices."""
    d, rows, blocks = cfg.d, cfg.rows, cfg.blocks
    sw = d + STATE_EXTRA_COLUMNS
    f32 = ops.float32
    st = ops.sbuf((rows, blocks * sw), f32)
    init = ops.sbuf((rows, blocks * sw), f32)
    al = ops.sbuf((rows, blocks * 2), f32)
    # every block's (o, -m, l) = (0, -M_FLOOR, 0): a whole-tile memset, then the -m column of
    # each block, on GpSimd (idle here; VectorE / ScalarE carry the steps)
    for t in (init, st):
        ops.memset(t, 0.0, engine="gpsimd")
        for j in ops.parallel_range(blocks):
            ops.memset(t[:, ops.ds(j * sw + d, 1)], -M_FLOOR, engine="gpsimd")
    ops.memset(al, 0.0, engine="gpsimd")
    q_raw = []
    for k in ops.static_range(cfg.nd):
        dk = min(P, d - k * P)
        qr = ops.sbuf((dk, blocks * rows), q_dtype)
        ops.memset(qr, 0.0, engine="gpsimd")
        q_raw.append(qr)
    return GroupTiles(st=st, init=init, al=al, q_raw=tuple(q_raw))


def constants(ops, cfg, init, num_kv_heads):
    """A class's constants, built once per kernel (key indices, masks, identities, resets)."""
    kidx = []
    for phase in (cfg.full, cfg.partial):
        kidx.append(_key_index(ops, cfg, phase)
                    if phase.items > 0 and (phase.masked or cfg.opts.alibi) else None)
    consts = None
    if cfg.full.keys_on_partitions:
        consts = decode_constants(ops, cfg.rows, max(cfg.full.step_keys, cfg.partial.step_keys),
                                  cfg.kd, additive=additive_decode_mask(ops, cfg))
    eye = None
    if cfg.fp8_direct:      # identity matmuls transpose fp8 K rows (and the overlay rows)
        eye = (identity_tile(ops, P, cfg.full.kv.dtype), identity_tile(ops, P, cfg.kd))
    mask_eye = None
    part = cfg.partial
    if (part.items > 0 and not part.keys_on_partitions and not keys_by_dma(ops, cfg, part)
            and additive_mask_ok(ops, cfg.step_config(part))):
        # masks added on TensorE: every key of a partial tile has a finite score (the K tile is
        # zeroed before its gathers, sched_tile.gather_kv)
        mask_eye = mask_eye_tile(ops, cfg.rows, cfg.kd)
    ones = None
    if not cfg.full.keys_on_partitions:     # query-rows steps: row sums as P 1 on TensorE
        ones = ops.sbuf((P, 2), cfg.kd)
        ops.memset(ones, 1.0, engine="gpsimd")
    # a group's state reset: by DMA from a table of init's rows where that pays
    # (sched_item.reset_by_dma: no decode class, VectorE or its SBUF port the busier), else a
    # VectorE select per item
    reset = (state_reset_table(ops, init, ops.launch_core()[0])
             if reset_by_dma(ops, cfg, num_kv_heads) else None)
    return Constants(kidx=tuple(kidx), consts=consts, eye=eye, mask_eye=mask_eye, ones=ones,
                     reset=reset)


def fresh_start(cfg, phase) -> bool:
    """Whether the phase's items skip the state select and load and read their group's initial
    values from the init tile at their first step instead (decode layout; the host's promise
    ``SchedOptions.fresh_items``: every item that stores anything starts its group and no item
    loads a state, so no state carries from one item to the next)."""
    return bool(cfg.decode and cfg.opts.fresh_items[int(phase.masked)])


def additive_decode_mask(ops, cfg) -> bool:
    """Whether the masked keys-on-partitions steps add their mask on TensorE
    (``sched_decode.DecodeConstants.mask_eye``) instead of a VectorE select: no soft-cap or
    ALiBi, a kernel dtype with fp32's exponent range, and every key of a partial tile a finite
    score unless its own sequence's K is not -- no stale rows (``sched_tile.stale_keys_ok`` and
    the K^T-by-DMA tile keep an earlier item's keys unless the rows nest)."""
    part = cfg.partial
    stale = ((keys_by_dma(ops, cfg, part) or stale_keys_ok(ops, cfg, part))
             and not nested_tiles(cfg, part))
    return (part.items > 0 and cfg.opts.logits_soft_cap is None and not cfg.opts.alibi
            and dtype_name(cfg.kd) in ("bfloat16", "float32") and not stale)


def _key_index(ops, cfg, phase):
    """The phase's key-index tile (masks, ALiBi) in its steps' key order: per (128-key chunk,
    row) column with keys on partitions; natural order for masked steps that take their keys so
    (``sched_range.natural_order``), where only ALiBi reads it (the range selects count keys
    themselves: None without ALiBi); the tiled order otherwise."""
    geo = phase.geo
    if phase.keys_on_partitions:
        return key_index_columns(ops, geo.nL, geo.bp)
    if phase.masked and natural_order(ops, geo.bp, phase.step_keys):
        return key_index_tile(ops, cfg.rows, geo.W // P, 1) if cfg.opts.alibi else None
    return key_index_tile(ops, cfg.rows, geo.nL, geo.bp)


@dataclass(frozen=True)
class PhaseRun:
    """What the items of one phase of one KV head share: the class's configuration and inputs,
    the phase, the head, the class's group tiles and constants, the phase's persistent KV tiles
    (:func:`phase_tiles`)."""

    cfg: Any
    ins: Any
    phase: Any
    head: Any
    tiles: Any
    const: Any
    kv_tiles: Any


def part_items(cfg, phase) -> int:
    """Items of ``phase`` per item part (all of them with ``cfg.opts.item_parts`` == 1)."""
    return phase.items // cfg.opts.item_parts


def phase_tiles(ops, cfg, phase):
    """The phase's persistent KV tiles, zeroed once (None where each item zeroes its own)."""
    rows_shape = (P, phase.geo.nL * phase.geo.bp * cfg.d)      # a tile's K or V cache rows
    if not phase.masked:
        # Full items write every row; padding items (all DMAs skipped) then read the last
        # real item's rows: allocated (and zeroed, on GpSimd: VectorE is the busier engine of
        # prefill and mixed batches) once so nothing is ever uninitialised.
        k_shape = (cfg.d, phase.geo.W) if keys_by_dma(ops, cfg, phase) else rows_shape  # K^T / K
        return (zeroed(ops, k_shape, phase.kv.dtype, "gpsimd"),
                zeroed(ops, rows_shape, phase.kv.dtype, "gpsimd"))
    if nested_tiles(cfg, phase):
        # Masked items whose written rows nest (SchedOptions.nested_rows): one K (K^T) and one
        # V tile for the head and part, zeroed once; a row an item does not write still holds
        # zeros (sched_tile.nested_tiles).
        k_shape = (cfg.d, phase.geo.W) if keys_by_dma(ops, cfg, phase) else rows_shape
        k_dtype = cfg.kd if keys_by_dma(ops, cfg, phase) else phase.kv.dtype
        return (zeroed(ops, k_shape, k_dtype, "gpsimd"),
                zeroed(ops, rows_shape, phase.kv.dtype, "gpsimd"))
    if keys_by_dma(ops, cfg, phase):
        # Masked items with K^T by DMA transpose: one K^T tile for the phase, zeroed once.
        # Columns an item's DMAs skip keep an earlier item's keys (or NaN garbage), which
        # only ever reach scores of keys no row sees: the mask SELECTS those away (the QK
        # matmul contracts over channels, so a column never mixes into another key's score).
        # V stays zeroed per item (P = 0 times a stale NaN would not be 0).
        return (zeroed(ops, (cfg.d, phase.geo.W), cfg.kd, "gpsimd"), None)
    if stale_keys_ok(ops, cfg, phase):
        # Masked keys-on-partitions items on NeuronCore-v3+: one K rows tile for the phase,
        # zeroed once; rows an item's DMAs skip keep an earlier item's keys, which reach only
        # their own keys' scores and are selected away (sched_tile.stale_keys_ok).
        return (zeroed(ops, rows_shape, phase.kv.dtype, "gpsimd"), None)
    return None


def run_items(ops, run, first, count):
    """Items ``[first, first + count)`` of ``run``'s phase (``count`` static; ``first`` an int
    or a loop / program index), in metadata chunks of ``contract.chunk_size(count)`` items."""
    chunk = chunk_size(count)
    for c in ops.sequential_range(count // chunk):
        run_chunk(ops, run, first + c * chunk, chunk)


def run_chunk(ops, run, item0, chunk):
    """One metadata chunk: items ``[item0, item0 + chunk)`` of ``run``'s phase (``chunk`` <=
    ``contract.MAX_CHUNK``, static) preloaded, then each item."""
    cfg, ins, phase, head, const = run.cfg, run.ins, run.phase, run.head, run.const
    masked, m, rows, d = phase.masked, phase.meta, cfg.rows, cfg.d
    ki, kf = m.ki, m.kf
    which = 1 if masked else 0
    mi_all, mf_all = ins.meta_i[which], ins.meta_f[which]
    q_all, i_all = ins.q_items[which], ins.i_items[which]
    mi = ops.sbuf((P, chunk * ki), ops.int32)
    ops.load(mi, mi_all[head, :, ops.ds(item0 * ki, chunk * ki)])
    mf = ops.sbuf((P, chunk * kf), ops.float32)
    ops.load(mf, mf_all[:, ops.ds(item0 * kf, chunk * kf)])
    q = bounds = init = None
    if cfg.decode and masked:      # the chunk's bounds, one partition
        bounds = ops.sbuf((1, chunk * 2 * rows), ops.float32)
        ops.load(bounds, ins.bounds_p[0:1, ops.ds(item0 * 2 * rows, chunk * 2 * rows)])
    if cfg.decode:       # the chunk's Q^T, scaled once into the kernel dtype
        q = chunk_queries(ops, q_all, head * d, d, item0 * rows, chunk * rows,
                          scale=cfg.scale, kernel_dtype=cfg.kd)
    if cfg.decode and cfg.opts.row_init:      # the chunk's row init values (rows, chunk * 4)
        init = ops.sbuf((rows, chunk * Q_INIT_COLUMNS), ops.float32)
        ops.load(init, i_all[ops.ds(head * rows, rows),
                             ops.ds(item0 * Q_INIT_COLUMNS, chunk * Q_INIT_COLUMNS)])
    if const.reset is None:
        resets = ops.flags(mf, m.reset, kf, chunk)
    else:
        resets = reset_ids(ops, const.reset, mf, m.reset, kf, chunk)
    data = Chunk(mi=mi, mf=mf, q=q, bounds=bounds, init=init, resets=resets)
    for it in ops.sequential_range(chunk):
        _item(ops, cfg, ins, phase, data, it, run.tiles, const, run.kv_tiles, head)


def _item(ops, cfg, ins, phase, data, it, tiles, const, kv_tiles, head):
    """Item ``it`` of the chunk: load / reset / carry the group state, gather Q and KV, fold the
    tile, store."""
    m, masked = phase.meta, phase.masked
    ci, cf = it * m.ki, it * m.kf
    d, rows, blocks = cfg.d, cfg.rows, cfg.blocks
    st, init, al = tiles.st, tiles.init, tiles.al
    mi, mf = data.mi, data.mf
    sw = d + STATE_EXTRA_COLUMNS
    # Step 1: a group starting here resets every row's state and loads its Q^T and its rows'
    # initial values (skipped rows keep the group's values): the values into init, then a
    # select (stale NaN cannot leak); with const.reset (NeuronCore-v3+, no decode class) a DMA
    # from the initial table, then the values straight into the state (both skipped unless a
    # group starts).
    core = ops.launch_core()[0]
    if const.reset is not None:
        reset_state(ops, st, const.reset, data.resets, it, core)
    if cfg.opts.row_init and cfg.decode:    # one block; this item's values, preloaded
        ops.copy(init[:, ops.ds(d, 2)], data.init[:, ops.ds(it * Q_INIT_COLUMNS, 2)])
        if cfg.opts.alibi:
            ops.copy(al[:, ops.ds(0, 2)],
                     data.init[:, ops.ds(it * Q_INIT_COLUMNS + Q_INIT_SLOPE, 2)])
    elif cfg.opts.row_init:
        # one gather per group start (skipped otherwise) for every block's (-m, l), straight
        # into the blocks' init columns (d + 2 apart; the state's after a reset DMA), one for
        # every block's ALiBi (slope, slope * position), already in al's layout
        into = st if const.reset is not None else init
        ops.gather(into[:, ops.ds(d, (blocks - 1) * sw + 2)], ins.q_init, mi, ci + m.ini,
                   tokens=blocks, step=Q_INIT_COLUMNS, width=2, dst_step=sw)
        if cfg.opts.alibi:
            ops.gather(al, ins.q_init, mi, ci + m.ini, col0=Q_INIT_SLOPE, tokens=blocks,
                       step=Q_INIT_COLUMNS)
    fresh = fresh_start(cfg, phase)
    if const.reset is None and not fresh:
        ops.where(st, data.resets.column(it, rows), init, st)
    if cfg.decode:       # decode layout: one block, Q^T preloaded per chunk
        qs = [q[:, ops.ds(it * rows, rows)] for q in data.q]
    else:
        qs = load_q_slices(ops, tiles.q_raw, ins.query_t, mi, ci + m.q, scale=cfg.scale,
                           kernel_dtype=cfg.kd)
    # Step 2 (partial phase): the group's state left by the full phase.
    if masked and not fresh:
        load_state(ops, st, mi, ci + m.st, ins.state, core)
    # Step 3: the KV tile (the kernel dtype, or fp8 fed to TensorE as is), K^T per channel slice.
    k_rows, v_rows, k_ov, v_ov = gather_kv(ops, cfg, phase, mi, ci + m.kv, ins.overlay, head,
                                           kv_tiles)
    k_t = transpose_keys(ops, cfg, phase, k_rows, k_ov, const.eye)
    # Step 4: fold the tile into every block's state, step by step (<= 2048 keys per step; with
    # keys on partitions, as many keys as fit one PSUM bank of scores).

    def alibi_of(j):
        # bias = slope * (k0 + t) - slope * qpos  ->  scale slope, offset slope*k0 - slope*qpos
        slope = al[:, ops.ds(j * 2, 1)]
        off = ops.sbuf((rows, 1), ops.float32)
        ops.tensor_scalar(off, slope, "multiply", mf[0:rows, ops.ds(cf + m.k0, 1)],
                          op1="subtract", operand1=al[:, ops.ds(j * 2 + 1, 1)])
        return slope, off

    tile = KVTile(k_t=k_t, v_rows=v_rows, v_overlay=v_ov, kidx=const.kidx[int(masked)],
                  mask_eye=const.mask_eye if masked else None, ones=const.ones)
    fold_tile(ops, cfg.fold_config(phase, keys_by_dma(ops, cfg, phase)), qs, tile, st, mf, cf, consts=const.consts,
              chunk_bounds=data.bounds, it=it, alibi_of=alibi_of if cfg.opts.alibi else None,
              init=init if fresh else None)
    # Step 5: stores (row indices out of bounds -> skipped): full phase the state, partial
    # phase the output.
    # (the output division, SBUF only, on GpSimd: idle here, VectorE / ScalarE carry the steps)
    store_blocks(ops, st, mi, ci + (m.out if masked else m.st), ins.out, ins.state, rows=rows,
                 blocks=blocks, d=d, masked=masked, engine="gpsimd", core=core)

