"""GQA query packing: a KV head's G query heads presented to the kernel as extra query rows.
Spec: ``docs/layouts.md`` §11.

The kernel (grid ``[1, Hkv]``) runs one flash step per (128-row Q tile, query head of the
group, 128-key block). A decode-heavy batch has few real rows per Q tile (16 decode tokens ->
one Q tile with 16 real rows), so the G heads of a group cost G mostly-padding passes over
every KV tile. Packing gives the kernel ``H' = Hkv`` heads (G' = 1) and ``T' = T * G`` rows:

    expanded row  qo_i*G + a*G + g   (sequence i, its token a, head g of the group)
                  = (global token t)*G + g   -- t-major, sequences stay contiguous
    query'[t*G + g, h]      = query[t, h*G + g]          (pack_query;   inverse unpack_output)
    key'/value'[t*G + g, h] = key/value[t, h]            (pack_kv: each new token's K/V G times)
    query_lens'             = query_lens * G             (packed_query_lens)
    mask' = build_attention_mask(plan') with its active block ANDed with same-g:
            (row % G) == (col % G)                        (packed_attention_mask)

Why the mask is exact: rows and columns of sequence i both start at ``qo_i*G``; with equal
expanded lengths the (bottom-right aligned, causal) active mask allows column ``a'*G + g'`` for
row ``a*G + g`` iff ``a'*G + g' <= a*G + g``, and with ``g' == g`` that is ``a' <= a``: exactly
the keys the original token attended, each once (the duplicates for other g are masked out, so
the softmax is unchanged). The context mask of plan' gives every expanded row of sequence i
sequence i's context, which is what each of its heads needs.

Work model (:func:`gqa_packing_work`), in 128x128 score blocks per KV head:
    unpacked  G * (n_q * c + n_q (n_q + 1) / 2),   n_q  = Qpad / 128
    packed        n_q' * c + n_q' (n_q' + 1) / 2,  n_q' = Qpad' / 128 = ceil(T*G / 128)
with c = context columns / 128 (the kernel visits every context tile for every Q tile; the
active part is causal-skipped at 128-key granularity).

Cost (:func:`gqa_packing_cost`): every (Q tile, 128-key block) pass also has work that the G
heads of a group share -- the mask tile's DMA (128 x 128 bytes) and, in the context tiles, the
zeroing of the values no row sees -- worth TILE_PASS_OVERHEAD (0.75) of one head's score block:
    unpacked  blocks_unpacked * (1 + 0.75 / G)     packed  blocks_packed * (1 + 0.75)
(packing multiplies the passes, so it multiplies that work too: a mixed batch of 4 x 128-token
chunks and 12 decodes has 0.86 of the unpacked score blocks packed, but its (Qpad x context)
mask grows G-fold, and packing it was 1.36x slower on trn1 and 1.42x on trn2, MODELED).
:func:`choose_gqa_packing` packs iff G > 1 and packed cost <= PACKING_MARGIN (0.9) x unpacked
cost. Both constants are calibrated on the modeled time (nki_sim.cost; the dense kernel on each
target's default API: legacy on trn1, current on trn2) over 168 batches, each on trn1 and trn2:
``scripts/bench_gqa_packing.py --sweep`` (66 batches of 4 sequences x 1..128 new tokens, G =
2/4/8, contexts 256 and 2048), the script's 6 batches and 12 mixed batches (1-3 prefill chunks
of 64-256 tokens with 2-15 decodes, contexts 512-4096, G = 2/4/8). With them no batch packs into
a modeled loss (the worst packed one: modeled packed / unpacked 0.922) and no gain above 4 % is
declined (two of 3.6 %). The block count alone with a 0.9 margin (the earlier rule) packed 20 of
the sweep's and script's 144 into modeled losses (up to 1.36x slower); an overhead of 0.5 with a
0.85 margin packed 2 mixed batches into losses of up to 4.6 %. On trn2's legacy API packing
pays more (P^T by one DMA per 128 x 128 block: 1 x 128-token chunk + 3 decodes packs to 0.77
there, 0.98 on the current API), which this rule, fitted to each target's default API, declines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host.dense.masks import build_attention_mask
from host.dense.plan import PARTITIONS, PagedAttentionPlan, round_up
from host.validation import check_int, check_lens, check_ndim, fail

# pack only when the packed cost is <= 90 % of the unpacked one (module docstring)
PACKING_MARGIN = 0.9
# work per (Q tile, 128-key block) pass that a group's heads share, in one head's score blocks
TILE_PASS_OVERHEAD = 0.75

__all__ = [
    "PACKING_MARGIN",
    "TILE_PASS_OVERHEAD",
    "gqa_packing_cost",
    "group_size",
    "packed_query_lens",
    "pack_query",
    "pack_kv",
    "unpack_output",
    "packed_attention_mask",
    "gqa_packing_work",
    "choose_gqa_packing",
]


def group_size(num_heads: Any, num_kv_heads: Any) -> int:
    """G = num_heads // num_kv_heads (ValueError unless num_kv_heads divides num_heads)."""
    H = check_int("num_heads", num_heads, min_value=1)
    Hkv = check_int("num_kv_heads", num_kv_heads, min_value=1)
    if H % Hkv:
        fail("num_heads", f"be a multiple of num_kv_heads={Hkv}", H)
    return H // Hkv


def packed_query_lens(query_lens: Any, G: int) -> np.ndarray:
    """(S,) int64 ``query_lens * G``: expanded rows per sequence."""
    q = check_lens("query_lens", query_lens, min_value=1)
    return q * check_int("G", G, min_value=1)


def pack_query(query: np.ndarray, num_kv_heads: int) -> np.ndarray:
    """(T, H, d) -> (T*G, Hkv, d): ``out[t*G + g, h] = query[t, h*G + g]``.

    Inverse: :func:`unpack_output` (same index map). A new array; the input is not modified.
    """
    check_ndim("query", query, 3)
    T, H, d = query.shape
    G = group_size(H, num_kv_heads)
    return np.ascontiguousarray(
        query.reshape(T, num_kv_heads, G, d).transpose(0, 2, 1, 3).reshape(T * G, num_kv_heads, d))


def unpack_output(out: np.ndarray, num_heads: int) -> np.ndarray:
    """(T*G, Hkv, d) -> (T, H, d): ``result[t, h*G + g] = out[t*G + g, h]``; inverse of pack_query."""
    check_ndim("out", out, 3)
    TG, Hkv, d = out.shape
    G = group_size(num_heads, Hkv)
    if TG % G:
        fail("out.shape[0]", f"be a multiple of G = {G}", TG)
    T = TG // G
    return np.ascontiguousarray(out.reshape(T, G, Hkv, d).transpose(0, 2, 1, 3).reshape(T, Hkv * G, d))


def pack_kv(x: np.ndarray, G: int) -> np.ndarray:
    """(T, Hkv, d) -> (T*G, Hkv, d): each new token's K (or V) repeated G times, ``out[t*G + g] = x[t]``."""
    check_ndim("key/value", x, 3)
    return np.repeat(x, check_int("G", G, min_value=1), axis=0)


def packed_attention_mask(plan: PagedAttentionPlan, G: int) -> np.ndarray:
    """Kernel mask for a packed plan: bool (Qpad', ctx + Qpad').

    ``plan`` must be the plan of the expanded lengths (``query_lens`` all multiples of G).
    ``build_attention_mask(plan)`` (context part reordered, active part block-diagonal causal)
    with the active block ANDed with ``row % G == col % G``. The returned array is fresh.
    """
    G = check_int("G", G, min_value=1)
    if np.any(plan.query_lens % G):
        fail("plan.query_lens", f"be multiples of G = {G} (a packed plan)", plan.query_lens.tolist())
    mask = build_attention_mask(plan)
    if G > 1:
        Tp, ctx = plan.num_queries, plan.context_kv_len
        g = np.arange(Tp) % G
        mask[:Tp, ctx:ctx + Tp] &= g[:, None] == g[None, :]
    return mask


def _tiles(rows: int) -> int:
    return max(PARTITIONS, round_up(rows, PARTITIONS)) // PARTITIONS


def gqa_packing_work(query_lens: Any, num_heads: int, num_kv_heads: int, *,
                     context_lens: Any = None, large_tile_size: int = 2048) -> tuple[int, int]:
    """(unpacked, packed) 128x128 score blocks per KV head (module docstring formula).

    ``context_lens`` (S,) sets the context columns to ``max(LT, round_up(sum ctx_i, LT))``
    (block rounding ignored); None assumes the kernel's minimum, one large tile (LT columns),
    which under-weights the context part and so never favours packing more than the real batch.
    """
    q = check_lens("query_lens", query_lens, min_value=1)
    G = group_size(num_heads, num_kv_heads)
    LT = check_int("large_tile_size", large_tile_size, min_value=PARTITIONS)
    ctx_tokens = 0 if context_lens is None else int(
        check_lens("context_lens", context_lens, min_value=0, length=q.shape[0],
                   length_arg="query_lens").sum())
    c = max(LT, round_up(ctx_tokens, LT)) // PARTITIONS
    T = int(q.sum())
    n, n_p = _tiles(T), _tiles(T * G)
    return G * (n * c + n * (n + 1) // 2), n_p * c + n_p * (n_p + 1) // 2


def gqa_packing_cost(query_lens: Any, num_heads: int, num_kv_heads: int, *,
                     context_lens: Any = None, large_tile_size: int = 2048) -> tuple[float, float]:
    """(unpacked, packed) cost: :func:`gqa_packing_work`'s score blocks plus each pass's shared
    work (TILE_PASS_OVERHEAD per Q tile and 128-key block, shared by the G heads of a group
    when unpacked): ``unpacked * (1 + overhead / G)``, ``packed * (1 + overhead)``."""
    unpacked, packed = gqa_packing_work(query_lens, num_heads, num_kv_heads,
                                        context_lens=context_lens,
                                        large_tile_size=large_tile_size)
    G = group_size(num_heads, num_kv_heads)
    return unpacked * (1 + TILE_PASS_OVERHEAD / G), packed * (1 + TILE_PASS_OVERHEAD)


def choose_gqa_packing(query_lens: Any, num_heads: int, num_kv_heads: int, *,
                       context_lens: Any = None, large_tile_size: int = 2048) -> bool:
    """True iff packing does clearly less kernel work: G > 1 and packed <= PACKING_MARGIN *
    unpacked in :func:`gqa_packing_cost` (constants: module docstring).

    Decode-heavy batches pack (e.g. 16 decode tokens, G = 4: 1 Q tile instead of 4 passes);
    prefill-heavy ones do not (T a multiple of 128 saves no context pass, and the active part
    grows about G-fold). G == 1 never packs.
    """
    unpacked, packed = gqa_packing_cost(query_lens, num_heads, num_kv_heads,
                                        context_lens=context_lens, large_tile_size=large_tile_size)
    return group_size(num_heads, num_kv_heads) > 1 and packed <= PACKING_MARGIN * unpacked
