"""Host schedule for the scheduled (block-sparse) paged-attention kernel.

Layouts and every formula here are specified in ``docs/layouts.md`` ("Scheduled kernel").

The kernel (``nki_kernels/scheduled/scheduled_attention.py``) reads every key of a sequence -- its cached
context and its new tokens -- through indirect DMA gathers of *rows* of ``b'`` consecutive
tokens, and keeps the queries of one KV head as *query rows* ``(token, g)`` (the G query heads of
a KV head packed as rows). Work is a list of *items*: (Q group, KV tile) pairs, where

* a **Q group** is ``blocks`` blocks of ``rows`` query rows of ONE sequence (decode class:
  ``rows`` = a power of two >= G*q_len, one block; prefill class: 128-row blocks, up to 64 per
  group), and
* a **KV tile** is ``L = nL*128`` consecutive key rows (``W = L*b'`` keys) of the same sequence.

Only pairs that share a sequence are scheduled (block-sparse), and only tiles that some row of
the group can see (sliding windows prune whole tiles). An item is FULL when every real row of
the group sees every key of the tile and every key row comes from the cache (no mask work,
no memset in the kernel); otherwise it is PARTIAL (masked with per-row bounds). Full tiles may
also fill the partial phase's padding slots (``schedule_items.fill_partial_padding``), where
they cost what the empty slot would have.

The two phases have their own tile geometry: FULL items use tiles of the large tile size LT,
PARTIAL items tiles of the partial tile size LTp <= LT: a large tile that is not full is cut into
``W / Wp`` partial tiles and only those some row sees are scheduled, so the masked work at a
sequence's end (a decode's last tile often holds a handful of keys) and on a prefill's causal
diagonal is a fraction of a large tile. ``partial_tile_size="auto"`` (the standard kernel) picks
LTp per batch by weighing the masked keys saved against the per-item work of more items. Overlay
rows (a sequence's rows that are not whole cached rows) are rows of the partial geometry.

Dimensions
    S  sequences;  H / Hkv query / KV heads, G = H // Hkv;  d head size;  B block size
    b' tokens per gathered row;  T tiling factor (rows per block) = B // b';  nL loads per tile
    (full phase: from LT; partial phase: b'_p, T_p, nL_p from LTp, ``item_geometry``)
    R_i = q_i * G query rows of sequence i;  K_i = c_i + q_i keys of sequence i
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from host._arrays import readonly
from host.scheduled.schedule_items import (DECODE_ITEM_OVERHEAD_KEYS, ITEM_OVERHEAD_KEYS, bucket,
                                           check_seqs, choose_groups_and_partial_tile,
                                           choose_large_tile,
                                           class_sequences, group_blocks_for_parts,
                                           item_geometry, q_blocks, schedule_items, split_parts)
from host.scheduled.fresh_items import phase_fresh
from host.scheduled.row_nesting import nested_order, rows_nested, tile_rows_written
from host.scheduled.state_carry import carry_order
from host.validation import check_int, check_lens, check_power_of_two, fail
from nki_kernels.contract import (DECODE_MAX_ROWS, FUSED, KV_LAYOUTS, MAX_BLOCK_SIZE, MAX_CHUNK,
                                  MAX_GROUP_BLOCKS, MAX_LAUNCH_CORES as CORES, MAX_TILE_SIZE,
                                  MIN_BLOCK_SIZE, MIN_TILE_SIZE, PARTITIONS as P,
                                  cache_row_count, chunk_size, channel_slices, decode_layout,
                                  main_cache_row, meta_layout, state_row_sentinel, tile_geometry)
from nki_kernels.scheduled.sched_plan import max_group_blocks, meta_columns

__all__ = ["PhaseArrays", "ClassSchedule", "AttentionSchedule", "make_schedule", "bucket",
           "build_schedule", "DECODE_MAX_ROWS", "MAX_GROUP_BLOCKS", "MAX_CHUNK", "chunk_size",
           "ITEM_OVERHEAD_KEYS", "item_geometry", "meta_columns", "auto_large_tile",
           "class_sequences", "check_seqs"]

# The decode-class threshold, the prefill group cap, the metadata chunk, the tile geometry and
# the metadata columns are the host-kernel contract's (nki_kernels.contract), read here.


@dataclass(frozen=True, eq=False)
class PhaseArrays:
    """Runtime inputs of one kernel phase (a sequential loop over ``items`` items).

    meta_i: (Hkv, 128, items * ki) int32, item-major: item t's columns ``[t*ki, (t+1)*ki)`` are
        (per partition p)  kv[l] for l < nL          main-cache row (flat view of the phase's
                                                     geometry) or OOB; masked: l < nL_p
                           ov[l] for l < nL_p        overlay row or OOB            (masked only)
                           q[k], k < nd              Q^T row of the group for channel
                                                     128k + p or OOB (carry; not with keys on
                                                     partitions: the Q^T of every item is
                                                     preloaded per chunk instead)
                           st                        state row of the group: store (full) /
                                                     load (masked)
                           out                       output row or OOB             (masked only)
                           ini                       q_init row or OOB       (row_init, not
                                                     with keys on partitions)
        (group-major rows, docs/layouts.md §16.2: one id per partition moves every block of
        the group)
    meta_f: (128, items * kf) float32: reset (1.0 at a group's first item), then for masked
        phases of query-rows classes c[j], r[j]: query row p of block j sees tile-local key
        index t iff |t - c| < r; with ALiBi a last column k0 = first key position of the tile
        (tiles of the phase's geometry: W keys full, W_p keys masked).
    bounds: decode-layout classes, masked phase: (1, items * 2 * rows) float32, item t's
        ``c_q`` (columns ``t*2*rows + q``) and ``r_q`` (``t*2*rows + rows + q``) on ONE
        partition (the kernel broadcasts them); None otherwise.
    parts: the item parts (docs/layouts.md §16.3): items ``[p * items / parts, (p + 1) * items
        / parts)`` are part p's (its groups' items, then its padding; first in a full phase
        carrying a group's state, ``state_carry``), run by core p of an LNC=2 launch.
    nested_rows: masked phase: in every KV head and part each real item's gathers write every
        KV row the items before it wrote (``host.scheduled.row_nesting``), so the kernel may
        zero the phase's KV tiles once (``SchedOptions.nested_rows``).
    fresh_items: every item that stores anything starts its group and none loads a state
        (``host.scheduled.fresh_items``): the kernel may skip the state select and load
        (``SchedOptions.fresh_items``).
    """

    items: int
    real_items: int
    masked: bool
    meta_i: np.ndarray = field(repr=False)
    meta_f: np.ndarray = field(repr=False)
    item_block: np.ndarray = field(repr=False, default=None)   # (items,) Q block (-1: padding)
    bounds: np.ndarray = field(repr=False, default=None)       # decode layout, masked: see above
    parts: int = 1
    nested_rows: bool = False
    fresh_items: bool = False


@dataclass(frozen=True, eq=False)
class ClassSchedule:
    """One kernel launch: a class of sequences (decode or prefill) and its two phases.

    rows: query rows per Q block (partitions); blocks: Q blocks per group; num_blocks: Q blocks
    of the class; decode_layout: the kernel folds this class with keys on partitions; seqs: (n,) sequence ids of the class; row_token / row_head: (num_blocks*rows,)
    flat token index and head-in-group g of every query row (-1 = padding row); item_parts:
    the phases' item parts (:class:`PhaseArrays` ``parts``).
    """

    kind: str
    rows: int
    blocks: int
    num_blocks: int
    decode_layout: bool
    seqs: np.ndarray = field(repr=False)
    row_token: np.ndarray = field(repr=False)
    row_head: np.ndarray = field(repr=False)
    row_pos: np.ndarray = field(repr=False)
    partial: PhaseArrays = field(repr=False)
    full: PhaseArrays = field(repr=False)
    ov_rows: int = 0
    item_parts: int = 1


@dataclass(frozen=True, eq=False)
class AttentionSchedule:
    """The whole batch: geometry, the overlay row map and one :class:`ClassSchedule` per class.

    tiling_factor / tiled_block_size / loads: the full phase's T, b', nL (large tile LT);
    partial_tile_size / partial_tiling_factor / partial_tiled_block_size / partial_loads: the
        partial phase's LTp, T_p, b'_p, nL_p (equal to the full ones when LTp = LT).
    overlay_seq / overlay_pos0: (R_ov,) sequence id and first position of every overlay row
        (the row holds positions pos0 .. pos0 + b'_p - 1 of that sequence; positions >= K_i are
        zero padding). Overlay rows are the key rows (partial geometry) that are not whole rows
        of cached context: a sequence's partly filled last context row and its new tokens.
    kv_layout: the cache layout the main-cache row ids are for (``contract.KV_LAYOUTS``:
        "fused" (2, N, Hkv, B, d), "block_kv" vLLM's (N, B, Hkv, d) key / value caches).
    """

    num_kv_heads: int
    head_size: int
    block_size: int
    large_tile_size: int
    tiling_factor: int
    tiled_block_size: int
    loads: int
    partial_tile_size: int
    partial_tiling_factor: int
    partial_tiled_block_size: int
    partial_loads: int
    query_lens: np.ndarray = field(repr=False)
    context_lens: np.ndarray = field(repr=False)
    overlay_seq: np.ndarray = field(repr=False)
    overlay_pos0: np.ndarray = field(repr=False)
    classes: tuple = ()
    kv_layout: str = FUSED

    @property
    def keys_per_tile(self) -> int:
        return self.loads * P * self.tiled_block_size


def make_schedule(query_lens: Any, context_lens: Any, block_tables: np.ndarray, *, num_heads: int,
                  num_kv_heads: int, head_size: int, block_size: int, num_blocks: int,
                  large_tile_size: int = 2048, sliding_window: int | None = None,
                  alibi: bool = False, row_init: bool = False, query_itemsize: int = 4,
                  cache_itemsize: int = 4, kernel_itemsize: int = 2,
                  group_blocks_cap: int | None = None,
                  partial_tile_size: int | str | None = None,
                  kv_layout: str = FUSED, seqs: Any = None,
                  item_parts: int = 1) -> AttentionSchedule:
    """Build the schedule of one flat batch (validated lens; ``block_tables`` already checked).

    Args:
        query_lens (S,) >= 1 and context_lens (S,) >= 0: new tokens and cached tokens.
        block_tables: (S, >= ceil(max context / B)) int, ids in [0, num_blocks) where used.
        num_heads, num_kv_heads, head_size, block_size, num_blocks: the attention geometry.
        large_tile_size: LT, keys per KV tile (power of two in [512, 8192]).
        sliding_window: W (query at position p sees keys p-W+1 .. p) or None.
        alibi: add the per-item tile start (fp32 column ``k0``) that ALiBi biases need.
        row_init: add the ``ini`` columns (per-row initial values: attention sinks, ALiBi).
        query_itemsize, cache_itemsize, kernel_itemsize: bytes per element of the queries, the
            cache and the kernel's matmul dtype: a prefill group holds at most as many 128-row
            Q blocks as fit trn1's SBUF next to the tile (``nki_kernels.scheduled.sched_plan``; trn1 has
            the smaller SBUF, so the schedule fits both targets).
        group_blocks_cap: when given, the most 128-row Q blocks per prefill group instead of
            that plan (a kernel with its own SBUF budget, e.g. ``nki_kernels.mla.mla_attention``).
        partial_tile_size: LTp, keys per partial-phase tile before block-size tiling: a power of
            two in [512, LT], None (LT: one geometry for both phases) or "auto" (the size whose
            partial items cost least, ``host.scheduled.schedule_items.choose_partial_tile``; with
            it, prefill groups may be halved, ``choose_groups_and_partial_tile``).
        kv_layout: "fused" or "block_kv": the cache layout of the main-cache row ids in the
            ``kv`` metadata columns (``contract.main_cache_row``; docs/layouts.md §16.1, §18).
        seqs: the ids of the sequences this schedule covers (None: all). Sequences left out
            get no items and no overlay rows; tokens and sequence ids stay the batch's, so one
            schedule per class (``class_sequences``) gives each class its own tile sizes.
        item_parts: 1, or 2 to cut every class's items in two parts, one per physical core of
            an LNC=2 launch (:func:`host.scheduled.schedule_items.split_parts`; any Hkv).
    """
    q = check_lens("query_lens", query_lens, min_value=1)
    c = check_lens("context_lens", context_lens, min_value=0, length=q.shape[0],
                   length_arg="query_lens")
    if q.shape[0] == 0:
        fail("query_lens", "have at least one entry (one per sequence)", "0 entries")
    B = check_power_of_two("block_size", block_size, lo=MIN_BLOCK_SIZE, hi=MAX_BLOCK_SIZE)
    LT = check_power_of_two("large_tile_size", large_tile_size, lo=MIN_TILE_SIZE, hi=MAX_TILE_SIZE)
    if not (partial_tile_size is None or partial_tile_size == "auto"):
        check_power_of_two("partial_tile_size", partial_tile_size, lo=MIN_TILE_SIZE, hi=LT)
    if sliding_window is not None:
        sliding_window = check_int("sliding_window", sliding_window, min_value=1)
    if kv_layout not in KV_LAYOUTS:
        fail("kv_layout", f"be one of {KV_LAYOUTS}", repr(kv_layout))
    if seqs is not None:
        seqs = check_seqs(seqs, q.shape[0])
    if type(item_parts) is not int or not 1 <= item_parts <= CORES:
        fail("item_parts", f"be 1 .. {CORES} (the physical cores of the launch)", repr(item_parts))
    return build_schedule(q, c, block_tables, num_heads=num_heads, num_kv_heads=num_kv_heads,
                          head_size=head_size, block_size=B, num_blocks=num_blocks,
                          large_tile_size=LT, sliding_window=sliding_window, alibi=alibi,
                          row_init=row_init, query_itemsize=query_itemsize,
                          cache_itemsize=cache_itemsize, kernel_itemsize=kernel_itemsize,
                          group_blocks_cap=group_blocks_cap, partial_tile_size=partial_tile_size,
                          kv_layout=kv_layout, seqs=seqs, item_parts=item_parts)


def auto_large_tile(q: np.ndarray, *, num_heads: int, num_kv_heads: int, head_size: int,
                    block_size: int, itemsize: int, cache_itemsize: int, mixed_precision: bool,
                    sliding_window: int | None, partial_tile_size: int | None) -> int:
    """The scheduled kernel's ``large_tile_size="auto"`` for validated query lengths ``q``:
    ``host.scheduled.schedule_items.choose_large_tile`` (wider tiles for single-row decode
    batches, when the SBUF plan still holds one decode block), at least an explicit
    ``partial_tile_size``."""
    G = num_heads // num_kv_heads
    rows = 1 << max(0, int(int(q.max()) * G - 1).bit_length())
    kernel_itemsize = 2 if mixed_precision else itemsize

    def fits(lt):
        return max_group_blocks(nc_gen="gen2", block_size=block_size, large_tile=lt,
                                head_size=head_size, rows=rows, cache_itemsize=cache_itemsize,
                                query_itemsize=itemsize, kernel_itemsize=kernel_itemsize,
                                keys_on_partitions=decode_layout(rows, 1)) >= 1

    lt = choose_large_tile(q, num_queries_per_kv=G, block_size=block_size,
                           sliding_window=sliding_window, fits=fits)
    return lt if partial_tile_size is None else max(lt, int(partial_tile_size))


def build_schedule(q: np.ndarray, c: np.ndarray, block_tables: np.ndarray, *, num_heads: int,
                   num_kv_heads: int, head_size: int, block_size: int, num_blocks: int,
                   large_tile_size: int, sliding_window: int | None, alibi: bool, row_init: bool,
                   query_itemsize: int, cache_itemsize: int, kernel_itemsize: int,
                   group_blocks_cap: int | None,
                   partial_tile_size: int | str | None,
                   kv_layout: str = FUSED, seqs: np.ndarray | None = None,
                   item_parts: int = 1) -> AttentionSchedule:
    """:func:`make_schedule` on arguments it has validated (``q`` / ``c`` int64 (S,) length
    vectors, ``block_size`` / ``large_tile_size`` / ``partial_tile_size`` / ``sliding_window``
    / ``seqs`` / ``item_parts`` checked); what ``host.plan_paged_attention`` calls after its own
    single validation."""
    B, LT = block_size, large_tile_size
    G = num_heads // num_kv_heads
    full_geo = tile_geometry(B, LT)
    nd = channel_slices(head_size)
    Hkv = num_kv_heads
    S = q.shape[0]
    keys = c + q
    tok_off = np.concatenate(([0], np.cumsum(q)[:-1])).astype(np.int64)

    # Step 0: the classes (decode / prefill) and their Q blocks and groups.
    covered = np.zeros(S, bool)
    covered[np.arange(S) if seqs is None else seqs] = True
    specs = []
    for kind, seqs in class_sequences(q, G, np.nonzero(covered)[0]):
        if kind == "decode":
            rows = 1 << max(0, int(max(q[i] * G for i in seqs) - 1).bit_length())
            blocks = 1
        else:
            rows = P
            fit = group_blocks_cap
            if fit is None:
                fit = max_group_blocks(nc_gen="gen2", block_size=B, large_tile=LT,
                                       head_size=head_size, rows=P, cache_itemsize=cache_itemsize,
                                       query_itemsize=query_itemsize, kernel_itemsize=kernel_itemsize)
            blocks = group_blocks_for_parts([-(-int(q[i] * G) // P) for i in seqs],
                                            min(MAX_GROUP_BLOCKS, fit), item_parts)
        qb = q_blocks(seqs, rows, blocks, q=q, c=c, G=G, tok_off=tok_off)
        specs.append((kind, np.array(seqs), rows, blocks, qb))

    # Step 1: the partial phase's geometry (one per batch: the overlay rows are its rows).
    if partial_tile_size is None:
        LTp = LT
    elif partial_tile_size == "auto":
        def regroup(spec, cap):
            kind, seqs, rows, _, _ = spec
            return (kind, seqs, rows, cap,
                    q_blocks(list(seqs), rows, cap, q=q, c=c, G=G, tok_off=tok_off))
        LTp, specs = choose_groups_and_partial_tile(specs, regroup, B=B, LT=LT, c=c, keys=keys,
                                                    sliding_window=sliding_window)
    else:
        LTp = int(partial_tile_size)
    part_geo = tile_geometry(B, LTp)
    bpp = part_geo.bp
    n_main_p = c // bpp                               # partial geometry: rows read from the cache
    n_rows_p = -(-keys // bpp)                        # partial geometry: key rows in all
    ov_count = np.where(covered, n_rows_p - n_main_p, 0)
    ov_off = np.concatenate(([0], np.cumsum(ov_count)[:-1])).astype(np.int64)
    R_ov = int(ov_count.sum())
    overlay_seq = np.repeat(np.arange(S), ov_count)
    overlay_pos0 = (np.concatenate([n_main_p[i] + np.arange(ov_count[i]) for i in range(S)]) * bpp
                    if R_ov else np.zeros(0, np.int64)).astype(np.int64)
    ov_rows_total = max(R_ov, 1) * Hkv

    # Step 2: items and phase arrays of every class.
    classes = tuple(
        _class_schedule(kind, rows, blocks, qb, q=q, c=c, Hkv=Hkv, d=head_size, nd=nd,
                        geo={False: full_geo, True: part_geo}, sliding_window=sliding_window,
                        ov_off=ov_off, block_tables=block_tables, num_blocks=num_blocks,
                        ov_sentinel=2 * ov_rows_total, ov_rows_per_head=max(R_ov, 1),
                        alibi=alibi, row_init=row_init, seqs=seqs, kv_layout=kv_layout,
                        item_parts=item_parts)
        for kind, seqs, rows, blocks, qb in specs)
    return AttentionSchedule(
        num_kv_heads=Hkv, head_size=head_size, block_size=B, large_tile_size=LT,
        tiling_factor=full_geo.T, tiled_block_size=full_geo.bp, loads=full_geo.nL,
        partial_tile_size=LTp, partial_tiling_factor=part_geo.T,
        partial_tiled_block_size=part_geo.bp, partial_loads=part_geo.nL,
        query_lens=readonly(q.astype(np.int64)),
        context_lens=readonly(c.astype(np.int64)), overlay_seq=readonly(overlay_seq),
        overlay_pos0=readonly(overlay_pos0), classes=classes, kv_layout=kv_layout)


def _class_schedule(kind, rows, blocks, qb, *, q, c, Hkv, d, nd, geo, sliding_window, ov_off,
                    block_tables, num_blocks, ov_sentinel, ov_rows_per_head, alibi, row_init,
                    seqs, kv_layout, item_parts):
    """The two phases of one class (``qb``: ``schedule_items.q_blocks``; columns: :class:`PhaseArrays`).
    ``geo[masked]``: the tile geometry of the full (False) and partial (True) phase."""
    keys = c + q
    nblk, row_real, row_pos, groups = qb["nblk"], qb["row_real"], qb["row_pos"], qb["groups"]
    ngroups = len(groups)          # nblk = ngroups * blocks (group-major block ids)
    full_items, part_items, group_lo = schedule_items(qb, c=c, keys=keys, fg=geo[False], pg=geo[True],
                                              sliding_window=sliding_window)
    cut = split_parts(full_items, part_items, item_parts,
                      group_keys=[keys[i] for i, _ in groups], widths=(geo[False].W, geo[True].W),
                      overhead=DECODE_ITEM_OVERHEAD_KEYS if decode_layout(rows, blocks)
                      else ITEM_OVERHEAD_KEYS, per_tile=geo[False].W // geo[True].W)
    # partial items in an order whose written KV rows nest (the kernel then zeroes its tiles once)
    written = tile_rows_written(geo[True], keys, [i for i, _ in groups], group_lo)
    cut = tuple((f, nested_order(pi, written)) for f, pi in cut)
    # a group ending the full phase and starting the partial one keeps its state in SBUF
    cut3 = [carry_order(f, pi, written, decode=decode_layout(rows, blocks)) for f, pi in cut]
    cut, carried = tuple((f, pi) for f, pi, _ in cut3), [g for _, _, g in cut3]
    full_groups = {g for f, _ in cut for g, _ in f}
    # Every group ends in the partial phase (its last tile holds its new tokens' overlay rows),
    # which therefore writes every output.
    assert {g for _, pi in cut for g, _ in pi} == set(range(len(groups))), \
        "internal: group without partial item"

    def phase(parts_lists, masked):
        g = geo[masked]
        T, bp, L, nL, W = g.T, g.bp, g.L, g.nL, g.W
        n_main = c // bp                              # this geometry's rows read from the cache
        n_rows = -(-keys // bp)
        main_sentinel = cache_row_count(kv_layout, num_blocks, Hkv, T)   # past every view row
        n_real = sum(len(x) for x in parts_lists)
        per_part = bucket(max(len(x) for x in parts_lists))
        n_items = per_part * len(parts_lists)
        kop = decode_layout(rows, blocks)
        lay = meta_layout(loads=nL, blocks=blocks, head_size=d, masked=masked, alibi=alibi,
                          row_init=row_init, keys_on_partitions=kop)
        ki, kf = lay.ki, lay.kf
        mi = np.empty((Hkv, P, n_items, ki), np.int32)
        mf = np.zeros((P, n_items, kf), np.float32)
        item_block = np.full(n_items, -1, np.int64)
        bnd = np.zeros((n_items, 2 * rows), np.float32) if (masked and kop) else None
        p = np.arange(P)
        # defaults: every DMA skipped, reset off (padding items do nothing visible and move no
        # bytes); columns (meta_layout): kv, ov (masked), q (query rows), st, out (masked), ini
        kv_col, st_col = lay.kv, lay.st
        q_col = lay.q if lay.q is not None else st_col
        mi[:, :, :, kv_col:kv_col + nL] = main_sentinel
        if masked:
            mi[:, :, :, lay.ov:lay.ov + nL] = ov_sentinel
        mi[:, :, :, q_col:st_col] = Hkv * ngroups * d      # Q^T sentinel (first-axis size)
        st_skip = state_row_sentinel(ngroups * rows)       # state rows (per core slab)
        mi[:, :, :, st_col] = st_skip
        mi[:, :, :, st_col + 1:] = Hkv * ngroups * rows    # output rows and init rows
        # with a carried group (host.scheduled.state_carry) the full phase's padding goes first
        placed = [(pp * per_part + u + (0 if masked or carried[pp] is None else per_part - len(x)),
                   u, x, carried[pp]) for pp, x in enumerate(parts_lists) for u in range(len(x))]
        for t, u, items_list, kept in placed:
            gi, k = items_list[u]
            i, blist = groups[gi]
            end = u + 1 == len(items_list)      # kept: carried in from / out to the other phase
            first = (u == 0 or items_list[u - 1][0] != gi) and not (masked and u == 0 and gi == kept)
            last = (end or items_list[u + 1][0] != gi) and not (not masked and end and gi == kept)
            mf[:, t, lay.reset] = 1.0 if first else 0.0
            # KV rows of this tile: key row j = k*L + l*128 + p of sequence i
            j = k * L + np.arange(nL)[:, None] * P + p[None, :]            # (nL, 128)
            # key rows wholly before every row's window are not gathered (skipped: zeros), so
            # whatever the cache holds there never enters the tile
            seen = (j + 1) * bp > group_lo[gi]
            in_seq = (j < n_rows[i]) & seen
            main = (j < n_main[i]) & seen
            blk = np.zeros(j.shape, np.int64)          # block ids of main rows only (the table
            blk[main] = block_tables[i, j[main] // T]  # may have no column at all)
            sub = (j % T)
            for h in range(Hkv):
                rows_main = main_cache_row(kv_layout, blk.astype(np.int64), sub, h, Hkv, T)
                mi[h, :, t, kv_col:kv_col + nL] = np.where(main, rows_main, main_sentinel).T
                if masked:
                    ovr = h * ov_rows_per_head + ov_off[i] + (j - n_main[i])
                    mi[h, :, t, lay.ov:lay.ov + nL] = np.where(in_seq & ~main, ovr, ov_sentinel).T
            if not masked and not main.all():  # pragma: no cover - guarded by the classifier
                raise AssertionError("internal: a FULL item has rows outside the cache")
            if alibi:
                mf[:, t, lay.k0] = k * W
            item_block[t] = blist[0]
            # group-major rows (contract.MetaLayout): one per query row p of the group, all its
            # blocks side by side; rows no block of the group holds are skipped
            real_any = row_real[gi * blocks:(gi + 1) * blocks].any(axis=0)
            g_rows = gi * rows + np.arange(rows)
            if first and row_init and not kop:
                for h in range(Hkv):
                    mi[h, :, t, lay.ini] = _pad_rows(h * ngroups * rows + g_rows,
                                                     Hkv * ngroups * rows)
            if first and not kop:
                for kk in range(nd):
                    dk = min(P, d - kk * P)
                    for h in range(Hkv):
                        v = (h * ngroups + gi) * d + kk * P + p
                        mi[h, :, t, q_col + kk] = np.where(p < dk, v, Hkv * ngroups * d)
            # full phase (first): the group's state goes to the scratch after its last full
            # item; partial phase: loaded at its first partial item, output after its last.
            if (not masked and last) or (masked and first and gi in full_groups):
                v = np.where(real_any, g_rows, st_skip)
                mi[:, :, t, st_col] = _pad_rows(v, st_skip)[None, :]
            if masked and last:
                for h in range(Hkv):
                    v = np.where(real_any, h * ngroups * rows + g_rows, Hkv * ngroups * rows)
                    mi[h, :, t, lay.out] = _pad_rows(v, Hkv * ngroups * rows)
            for jj, b in enumerate(blist):
                real = row_real[b]
                if masked:
                    pos = row_pos[b]
                    lo = pos - sliding_window + 1 if sliding_window is not None else np.zeros_like(pos)
                    lo = np.maximum(lo, 0) - k * W
                    hi = pos + 1 - k * W
                    lo = np.where(real, lo, 0)
                    hi = np.where(real, hi, 0)
                    if kop:      # one block; row q's bounds in bnd[t, q] and bnd[t, rows + q]
                        bnd[t, :rows] = (lo + hi - 1) / 2.0
                        bnd[t, rows:] = (hi - lo) / 2.0
                    else:
                        mf[:rows, t, lay.bounds + 2 * jj] = (lo + hi - 1) / 2.0
                        mf[:rows, t, lay.bounds + 1 + 2 * jj] = (hi - lo) / 2.0
        nested = masked and rows_nested(mi, kv_col=kv_col, ov_col=lay.ov, loads=nL,
                                        part_items=[len(x) for x in parts_lists],
                                        per_part=per_part, main_sentinel=main_sentinel,
                                        ov_sentinel=ov_sentinel)
        fresh = all(g is None for g in carried) and phase_fresh(mi, mf, masked=masked,
            reset_col=lay.reset, st_col=st_col, out_col=lay.out if masked else None,
            st_skip=st_skip, out_skip=Hkv * ngroups * rows)
        return PhaseArrays(items=n_items, real_items=n_real, masked=masked, parts=len(parts_lists),
                           nested_rows=nested, fresh_items=fresh,
                           meta_i=readonly(mi.reshape(Hkv, P, n_items * ki)),
                           meta_f=readonly(mf.reshape(P, n_items * kf)),
                           item_block=readonly(item_block),
                           bounds=None if bnd is None else readonly(bnd.reshape(1, -1)))

    return ClassSchedule(kind=kind, rows=rows, blocks=blocks, num_blocks=nblk,
                         decode_layout=decode_layout(rows, blocks),
                         seqs=readonly(seqs), row_token=readonly(qb["row_token"]),
                         row_head=readonly(qb["row_head"]),
                         row_pos=readonly(np.where(row_real, row_pos, -1).reshape(-1)),
                         partial=phase([pi for _, pi in cut], True),
                         full=phase([f for f, _ in cut], False), item_parts=item_parts)


def _pad_rows(v: np.ndarray, sentinel: int) -> np.ndarray:
    """A (rows,) column padded with ``sentinel`` to 128 partitions."""
    return np.concatenate([np.asarray(v, np.int64), np.full(P - v.shape[0], sentinel, np.int64)])
