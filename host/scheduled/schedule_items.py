"""Which work a batch needs (``host.scheduled.schedule``, docs/layouts.md §16.2-16.3): tile geometries
(``nki_kernels.contract.TileGeometry``), Q blocks and groups, FULL / PARTIAL items with exact
pruning, the phases' static item counts (``bucket``), the full tiles that fill the partial
phase's padding slots, the cut of a class's groups into item parts (one per core of an LNC=2
launch), the ``"auto"`` partial tile size and the batch's classes (decode / prefill). Plain NumPy / Python on lengths; ``host.scheduled.schedule`` turns the items into kernel metadata.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host.validation import fail
from nki_kernels.contract import DECODE_MAX_ROWS, MIN_TILE_SIZE, TileGeometry, tile_geometry

__all__ = ["ITEM_OVERHEAD_KEYS", "DECODE_ITEM_OVERHEAD_KEYS", "MASKED_KEY_WEIGHT",
           "TileGeometry", "item_geometry", "q_blocks", "schedule_items", "bucket",
           "fill_partial_padding", "split_parts", "group_blocks_for_parts", "choose_partial_tile",
           "choose_groups_and_partial_tile", "MIN_AUTO_GROUP_BLOCKS", "choose_large_tile",
           "AUTO_LARGE_TILE", "AUTO_DECODE_MAX_ROWS", "AUTO_DECODE_ROW_TOKENS",
           "class_sequences", "check_seqs"]


def bucket(n: int) -> int:
    """Smallest ``m * 2**e >= n`` with ``m`` in {4, 5, 6, 7} (or n itself below 4): static item
    counts come from a geometric series (at most 25 % padding), so a serving engine compiles a
    bounded number of shapes. ``bucket(0) == 0``."""
    n = int(n)
    if n <= 4:
        return n
    e = max(0, (n - 1).bit_length() - 3)
    for m in (4, 5, 6, 7, 8):
        if m << e >= n:
            return m << e
    raise AssertionError("unreachable")  # pragma: no cover


# The per-item work of a partial item (its DMAs and small ops) in keys of masked work; what
# partial_tile_size="auto" weighs against the keys a smaller tile saves. Calibrated on the cost
# model (MODELED): every value from 3072 to at least 6144 makes "auto" pick the fastest size on
# each workload of scripts/bench_paged_attention.py and scripts/bench_variants.py (2048 missed
# the 4 x 512-token mixed batch, 1024 also the sliding window).
ITEM_OVERHEAD_KEYS = 4096
# A masked key of a query-rows (prefill) class costs more than a full item's: the mask work, and
# the natural-order P^T on TensorE + ScalarE where full steps transpose P on the DMA queues
# (trn2, current API). Fitted on the cost model (MODELED): 1.25 makes the "auto" choice halve
# the prefill groups of a causal-only prefill (1K new tokens, no context: 32-block groups and
# 1024-key partial tiles -> 16 blocks and 512 keys, trn2 current API 690 -> 604 us, trn1 929 ->
# 848), and changes no other choice on the batches of scripts/bench_paged_attention.py,
# bench_variants.py, bench_mla.py or the nki-pa demo (1.0 kept the 32-block groups). Held-out
# batches it was not fitted on: scripts/bench_masked_weight.py (docs/bench-masked-weight.md).
MASKED_KEY_WEIGHT = 1.25
# The same for an item of a decode class (one block of <= 64 rows, keys on partitions): its
# fixed work is a fraction of a 128-row group's. Calibrated on the cost model (MODELED, every
# decode class of scripts/bench_paged_attention.py, bench_variants.py, bench_mla.py and the
# nki-pa demo): 2048 keeps 4096-key partial tiles where the large tile is 4096 (32-token rows)
# and gives the demo's decodes 1024-key tiles at LT 2048 (trn2 866 -> 811 us, trn1 791 -> 763),
# which 4096 (the query-rows value) set to 2048; 1024 would cut the 4 x 512 + 60 batch's to 2048.
# Re-checked with the class launches charged one after the other (nki_sim.cost): 1024 makes
# 4 x 512 + 60 3.1 % slower on trn2's current API (8261 -> 8519 us) and 1.5 % on trn1; 512
# also 2 + 30 (trn2 2091 -> 3738, trn1 2955 -> 4049) and 32 decodes (2513 -> 2699). With the
# mixed batches as one pair launch (trn2 current API): 1024 makes 4 x 512 + 60 6084 -> 6475 us,
# 4096 leaves both mixed batches as they are (6084, 1773).
DECODE_ITEM_OVERHEAD_KEYS = 2048


# large_tile_size="auto" (scheduled kernel): 2048 keys per large tile (vLLM's LARGE_TILE_SZ
# default), except for batches of single-row decodes -- every sequence's G * q_len <=
# AUTO_DECODE_MAX_ROWS query rows, no sliding window -- whose large tile is widened until a
# cache row holds min(B, AUTO_DECODE_ROW_TOKENS) tokens (128 rows per tile): 32-token rows (8 KiB
# at d = 128, bf16) cut the fixed cost per DMA descriptor and the number of gathers and items.
# Calibrated on the cost model (MODELED, scripts/bench_paged_attention.py): 32 decodes of 2K-8K
# context, block 32, LT 4096 vs 2048: trn1 3409 vs 3504 us, trn2 2630 vs 2749 us; block 64 the
# same direction, block 16 already has 16-token rows at 2048 (4096 was 1 % slower), LT 8192 was
# slower; decode blocks of 16 rows (4 speculative tokens x G = 4) were 4.6 % slower on trn2.
AUTO_LARGE_TILE = 2048
AUTO_DECODE_MAX_ROWS = 8
AUTO_DECODE_ROW_TOKENS = 32


def choose_large_tile(query_lens, *, num_queries_per_kv: int, block_size: int,
                      sliding_window, fits=None) -> int:
    """``"auto"`` large tile size (keys per full-phase tile): :data:`AUTO_LARGE_TILE`, or for a
    batch whose every sequence has ``G * q_len <= AUTO_DECODE_MAX_ROWS`` rows and no sliding
    window, ``max(AUTO_LARGE_TILE, 128 * min(B, AUTO_DECODE_ROW_TOKENS))``. ``fits(LT)``: whether
    the kernel's SBUF plan holds one Q block at ``LT`` (None: assumed); a tile that does not fit
    falls back to :data:`AUTO_LARGE_TILE`."""
    q = np.asarray(query_lens, np.int64)
    if sliding_window is not None or q.size == 0 or \
            int(q.max()) * int(num_queries_per_kv) > AUTO_DECODE_MAX_ROWS:
        return AUTO_LARGE_TILE
    lt = max(AUTO_LARGE_TILE, 128 * min(int(block_size), AUTO_DECODE_ROW_TOKENS))
    if fits is not None and lt != AUTO_LARGE_TILE and not fits(lt):
        return AUTO_LARGE_TILE
    return lt


def item_geometry(block_size: int, large_tile_size: int) -> tuple[int, int, int, int]:
    """``(T, b', L, nL)`` of ``nki_kernels.contract.tile_geometry`` (both powers of two): T rows
    per block, b' = B // T tokens per row, L = max(LT // B, 128) rows per tile, nL = L // 128
    loads."""
    g = tile_geometry(block_size, large_tile_size)
    return g.T, g.bp, g.L, g.nL


def choose_partial_tile(specs, *, B, LT, c, keys, sliding_window) -> int:
    """``"auto"`` partial tile size: the power of two in [512, LT] whose partial items cost the
    least, an item costing its keys times its Q blocks plus ``ITEM_OVERHEAD_KEYS`` (decode
    classes: ``DECODE_ITEM_OVERHEAD_KEYS``), the per-item work -- metadata, state, overlay and
    output DMAs, small ops -- expressed in keys.
    Smaller tiles cut the masked keys at a sequence's end or on a causal diagonal; they also
    turn one item into several where a large tile is visible in whole (a window's lower edge)."""
    return _cheapest_partial_tile(specs, B=B, LT=LT, c=c, keys=keys,
                                  sliding_window=sliding_window)[1]


def _cheapest_partial_tile(specs, *, B, LT, c, keys, sliding_window, with_full=False):
    """``(cost, LTp)`` of :func:`choose_partial_tile`; ``with_full`` adds the full items (their
    keys times their Q blocks plus ``ITEM_OVERHEAD_KEYS`` each), which do not depend on LTp but
    do on the groups."""
    fg = tile_geometry(B, LT)
    best = None
    ltp = MIN_TILE_SIZE
    while ltp <= LT:
        pg = tile_geometry(B, ltp)
        cost = 0
        for kind, _, _, _, qb in specs:
            overhead = DECODE_ITEM_OVERHEAD_KEYS if kind == "decode" else ITEM_OVERHEAD_KEYS
            full, part, _ = schedule_items(qb, c=c, keys=keys, fg=fg, pg=pg,
                                           sliding_window=sliding_window)
            nblk = [len(qb["groups"][g][1]) for g, _ in part]
            weight = 1.0 if kind == "decode" else MASKED_KEY_WEIGHT
            cost += weight * sum(nblk) * pg.W + len(part) * overhead
            if with_full:
                nblk = [len(qb["groups"][g][1]) for g, _ in full]
                cost += sum(nblk) * fg.W + len(full) * overhead
        if best is None or cost < best[0]:
            best = (cost, ltp)
        ltp *= 2
    return best


# The smallest prefill group "auto" tries when it halves a class's groups.
MIN_AUTO_GROUP_BLOCKS = 8


def choose_groups_and_partial_tile(specs, regroup, *, B, LT, c, keys, sliding_window):
    """``"auto"`` for prefill groups and the partial tile together: ``specs`` as built (prefill
    groups as large as SBUF allows), ``regroup(spec, blocks)`` the same class with groups of at
    most ``blocks`` Q blocks. Halving a prefill class's groups (down to
    ``MIN_AUTO_GROUP_BLOCKS``) re-reads each full tile once per group but lets a causal
    diagonal's partial tiles skip the groups that see none of them; the cost of each option is
    every item's keys times its Q blocks (a partial item's weighted ``MASKED_KEY_WEIGHT``) plus
    ``ITEM_OVERHEAD_KEYS`` per item, full items included, at the option's cheapest partial
    tile. Returns ``(LTp, specs)`` (the first, i.e.
    largest, groups on a tie)."""
    kw = dict(B=B, LT=LT, c=c, keys=keys, sliding_window=sliding_window)
    best = None
    blocks = max((sp[3] for sp in specs if sp[0] == "prefill"), default=0)
    while True:
        cand = [regroup(sp, blocks) if sp[0] == "prefill" and sp[3] > blocks else sp
                for sp in specs]
        cost, ltp = _cheapest_partial_tile(cand, with_full=True, **kw)
        if best is None or cost < best[0]:
            best = (cost, ltp, cand)
        if blocks // 2 < MIN_AUTO_GROUP_BLOCKS:
            break
        blocks //= 2
    return best[1], best[2]


def q_blocks(seqs, rows, blocks, *, q, c, G, tok_off) -> dict:
    """Step 1 of a class: its Q blocks (query rows of one sequence, ``rows`` per block) and
    groups of up to ``blocks`` of them. Group g owns the block ids ``[g*blocks, (g+1)*blocks)``
    (the kernel's group-major layouts, docs/layouts.md "Scheduled kernel"): a sequence's blocks
    fill its groups in order and ids a group does not fill are padding blocks (every row a
    padding row). Returns nblk (= groups * blocks), row_token / row_head (nblk*rows,), row_pos /
    row_real (nblk, rows) and groups [(seq, [block ids])]."""
    groups = []                                       # (seq, [block ids]), ids assigned below
    first_row = []                                    # the first query row of each block
    for i in seqs:
        nb = -(-int(q[i]) * G // rows)
        for b0 in range(0, nb, blocks):
            g = len(groups)
            ids = list(range(g * blocks, g * blocks + min(blocks, nb - b0)))
            groups.append((int(i), ids))
            first_row += [(int(i), (b0 + j) * rows) for j in range(len(ids))]
    nblk = len(groups) * blocks
    row_token = np.full(nblk * rows, -1, np.int64)
    row_head = np.full(nblk * rows, -1, np.int64)
    row_pos = np.zeros((nblk, rows), np.int64)       # absolute query position of each row
    row_real = np.zeros((nblk, rows), bool)
    ids = [b for _, blist in groups for b in blist]
    for b, (i, r0) in zip(ids, first_row):
        r = r0 + np.arange(rows)
        real = r < q[i] * G
        row_real[b] = real
        row_pos[b] = c[i] + r // G
        row_token[b * rows:(b + 1) * rows] = np.where(real, tok_off[i] + r // G, -1)
        row_head[b * rows:(b + 1) * rows] = np.where(real, r % G, -1)
    return dict(nblk=nblk, row_token=row_token, row_head=row_head, row_pos=row_pos,
                row_real=row_real, groups=groups)


def schedule_items(qb: dict, *, c, keys, fg: TileGeometry, pg: TileGeometry, sliding_window):
    """Step 2 of a class: ``(full_items, part_items, group_lo)``. A large tile (``fg``) is FULL
    when every real row of the group sees all of it and all its rows are cached; otherwise its
    partial tiles (``pg``) that some row sees are PARTIAL items. Items are (group index, tile
    index of the phase's geometry); group_lo[g] = first key position any row of group g sees."""
    part_items, full_items = [], []
    group_lo = {}
    per_tile = fg.W // pg.W                           # partial tiles per large tile
    for gi, (i, blist) in enumerate(qb["groups"]):
        pos = qb["row_pos"][blist][qb["row_real"][blist]]
        lo_min = 0 if sliding_window is None else max(0, int(pos.min()) - sliding_window + 1)
        group_lo[gi] = lo_min
        lo_max = 0 if sliding_window is None else max(0, int(pos.max()) - sliding_window + 1)
        hi_min, hi_max = int(pos.min()) + 1, int(pos.max()) + 1
        end = int(keys[i])
        for k in range(-(-end // fg.W)):
            t0, t1 = k * fg.W, min((k + 1) * fg.W, end)
            if t1 <= lo_min or t0 >= hi_max:
                continue                              # no row of the group sees this tile
            if (k + 1) * fg.W <= c[i] - c[i] % fg.bp and lo_max <= t0 and hi_min >= (k + 1) * fg.W:
                full_items.append((gi, k))
                continue
            for kp in range(k * per_tile, (k + 1) * per_tile):
                u0, u1 = kp * pg.W, min((kp + 1) * pg.W, end)
                if u0 < u1 and u1 > lo_min and u0 < hi_max:
                    part_items.append((gi, kp))
    return full_items, part_items, group_lo


def fill_partial_padding(full_items: list, part_items: list, per_tile: int) -> tuple:
    """Step 2b of a class: ``(full_items, part_items)`` with the last ``m`` full items moved into
    the partial phase's padding slots, each as its ``per_tile`` (``W / W_p``) partial tiles, for
    the ``m`` that minimizes the full phase's :func:`bucket` (the smallest such ``m``; 0 when no
    move shrinks it). A padding slot runs the masked step on skipped DMAs, so a moved tile
    costs the partial phase nothing it did not spend (its bucket is unchanged: ``m * per_tile <=
    bucket(P) - P``), and the full phase loses ``bucket(F) - bucket(F - m)`` iterations. A moved
    tile is a masked item whose bounds let every row see every key; a group whose full items all
    move has no state round trip. Items stay ordered by group, then tile."""
    F, Pn = len(full_items), len(part_items)
    room = (bucket(Pn) - Pn) // per_tile
    m = min(range(min(F, room) + 1), key=lambda n: (bucket(F - n), n))
    if m == 0:
        return full_items, part_items
    moved = [(g, k * per_tile + u) for g, k in full_items[F - m:] for u in range(per_tile)]
    return full_items[:F - m], sorted(part_items + moved)


def split_parts(full_items: list, part_items: list, parts: int, *, group_keys, widths: tuple,
                overhead: float, per_tile: int) -> tuple:
    """Step 2c of a class: its items cut in ``parts`` parts, one per physical core of an LNC=2
    launch (docs/layouts.md §16.3): ``((full_items, part_items), ...)``, one pair per part,
    each then given :func:`fill_partial_padding`. Whole groups go to a part (a group's state
    stays on one core, in SBUF and in that core's scratch); the groups are dealt out largest
    first, each to the part with the least work so far. A group's work: over its items, the
    keys the tile holds of its sequence (``group_keys[g]`` keys in all; tile k of the full
    (partial) phase covers keys ``[k W, (k + 1) W)``, ``widths = (W, W_p)``) plus ``overhead``
    (the per-item work in keys). Items stay ordered by group, then tile, within a part."""
    if parts == 1:
        return (fill_partial_padding(full_items, part_items, per_tile),)
    work: dict = {}
    for items, W in ((full_items, widths[0]), (part_items, widths[1])):
        for g, k in items:
            seen = min(W, max(0, int(group_keys[g]) - k * W))
            work[g] = work.get(g, 0.0) + seen + overhead
    load, owner = [0.0] * parts, {}
    for g in sorted(work, key=lambda g: (-work[g], g)):
        p = min(range(parts), key=lambda j: (load[j], j))
        owner[g] = p
        load[p] += work[g]
    return tuple(fill_partial_padding([it for it in full_items if owner[it[0]] == p],
                                      [it for it in part_items if owner[it[0]] == p], per_tile)
                 for p in range(parts))


def group_blocks_for_parts(need: list, cap: int, parts: int) -> int:
    """Q blocks per group of a prefill class whose sequences need ``need`` 128-row blocks each,
    at most ``cap``: the longest sequence in one group (``parts`` = 1); cut in item parts
    (:func:`split_parts`, whole groups per part) the longest in ``parts`` groups at least, then
    halved while the class has fewer than two groups per part, so that the parts can balance
    (MODELED, H=4, Hkv=1, trn2 current API: a 2K prefill on 2K context LNC 2 / LNC 1 0.584 ->
    0.524 with four groups instead of two)."""
    blocks = max(1, min(cap, -(-max(need) // parts)))
    while parts > 1 and blocks > 1 and sum(-(-n // blocks) for n in need) < 2 * parts:
        blocks = -(-blocks // 2)
    return blocks


def check_seqs(seqs: Any, num_seqs: int) -> np.ndarray:
    """``seqs`` as a sorted int64 vector of distinct sequence ids in [0, num_seqs), at least one
    (``ValueError`` naming ``seqs`` otherwise)."""
    arr = np.asarray(seqs)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
        fail("seqs", "be a non-empty 1-D integer vector of sequence ids",
             f"{arr.dtype} array of shape {arr.shape}")
    ids = np.unique(arr.astype(np.int64))
    if ids.size != arr.size or ids[0] < 0 or ids[-1] >= num_seqs:
        fail("seqs", f"hold distinct sequence ids in [0, {num_seqs})", arr)
    return ids


def class_sequences(q: np.ndarray, num_queries_per_kv: int, seqs: Any = None) -> tuple:
    """The classes of a batch of query lengths ``q`` (S,): ``(("decode", ids), ("prefill",
    ids))`` without empty ones -- decode: ``q_i * G <= DECODE_MAX_ROWS`` query rows (one small
    block, keys on partitions), prefill: the rest (128-row blocks). ``seqs``: only these ids."""
    ids = np.arange(q.shape[0]) if seqs is None else np.asarray(seqs, np.int64)
    small = q[ids] * int(num_queries_per_kv) <= DECODE_MAX_ROWS
    return tuple((kind, [int(i) for i in ids[sel]])
                 for kind, sel in (("decode", small), ("prefill", ~small)) if sel.any())
