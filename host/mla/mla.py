"""Host side of MLA (multi-head latent attention) paged attention: input validation and its plan.

``check_mla_inputs`` validates the arguments of ``host.mla_paged_attention(q, kv_cache,
block_tables, query_lens, context_lens, *, kv_lora_rank=512, qk_rope_head_dim=64,
softmax_scale=None, ...)`` (``host/mla/mla_attention.py``) and returns a small frozen
:class:`MLAPlan`. Every rejection is a
``ValueError`` naming the argument, the constraint and the value received (valid but
unsupported: ``NotImplementedError``), raised before anything runs.

Dimensions: S sequences, T = sum(query_lens) new tokens, H query heads (one latent KV head shared
by all), R = kv_lora_rank, P = qk_rope_head_dim, cache (N, B, E), E >= R + P (docs/layouts.md §12).

Convention (as :func:`host.mla_paged_attention_ref`): the new tokens are already in the cache and
``context_lens[i]`` counts all of sequence i's cached tokens INCLUDING its ``query_lens[i]`` new
ones (so context_lens >= query_lens); host.paged_attention's context_lens excludes them.

    >>> import numpy as np
    >>> plan = check_mla_inputs(np.zeros((3, 16, 576), np.float32), np.zeros((8, 16, 640), np.float32),
    ...                         np.array([[0, 1], [5, -1]]), [2, 1], [20, 7])
    >>> plan.num_tokens, plan.num_heads, plan.entry_size, plan.context_blocks.tolist()
    (3, 16, 640, [2, 1])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from host._arrays import readonly, to_numpy
from host.cache.block_kv import is_block_kv
from host.cache.mla_layout import check_mla_cache
from host.validation import (check_block_tables, check_float_array, check_int, check_integer_array,
                             check_lens, check_softmax_scale, fail)

__all__ = ["MLAPlan", "check_mla_inputs", "mla_batch", "MAX_MLA_HEADS", "MLA_DTYPES"]

MAX_MLA_HEADS = 128            # query heads per launch: one SBUF partition each
MLA_DTYPES = ("float32", "bfloat16", "float16")
_INT32_MAX = np.iinfo(np.int32).max


@dataclass(frozen=True, eq=False)
class MLAPlan:
    """Validated shapes of one MLA attention call (arrays are read-only int64).

    Attributes:
        num_tokens T, num_heads H, num_blocks N, block_size B, entry_size E (allocated, >= R + P),
        kv_lora_rank R, qk_rope_head_dim P, num_seqs S;
        query_lens (S,), context_lens (S,) (including the new tokens);
        query_offsets (S,): first row of sequence i in q (exclusive prefix sum of query_lens);
        context_blocks (S,): ceil(context_lens / B), the block-table entries read per sequence;
        softmax_scale: the resolved scale (default 1 / sqrt(R + P)); dtype: name of q's dtype.
    """

    num_tokens: int
    num_heads: int
    num_blocks: int
    block_size: int
    entry_size: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    num_seqs: int
    query_lens: np.ndarray
    context_lens: np.ndarray
    query_offsets: np.ndarray
    context_blocks: np.ndarray
    softmax_scale: float
    dtype: str


def check_mla_inputs(q: Any, kv_cache: Any, block_tables: Any, query_lens: Any, context_lens: Any, *,
                     kv_lora_rank: int = 512, qk_rope_head_dim: int = 64,
                     softmax_scale: float | None = None) -> MLAPlan:
    """Validate MLA paged-attention inputs; return their :class:`MLAPlan`.

    Args:
        q: (T, H, R + P) float32 / bfloat16 / float16, 1 <= H <= 128; sequences contiguous, in order.
        kv_cache: (N, B, E), q's dtype, E >= R + P (entry [kv_c | k_pe | padding]).
        block_tables: (S, max_blocks) integer; row i's first ceil(context_lens[i] / B) entries must
            be block ids in [0, N); later entries are ignored (e.g. -1).
        query_lens: (S,) integers >= 1 summing to T.
        context_lens: (S,) integers >= query_lens (cached tokens including the new ones).
        kv_lora_rank, qk_rope_head_dim: R >= 1, P >= 1.
        softmax_scale: None (1 / sqrt(R + P)) or a finite real number.

    Raises:
        ValueError: any rule above broken (the message names the argument).
        NotImplementedError: an fp8 cache, or N * B beyond the int32 row-index range.
    """
    R = check_int("kv_lora_rank", kv_lora_rank, min_value=1)
    P = check_int("qk_rope_head_dim", qk_rope_head_dim, min_value=1)
    q_np, _ = to_numpy(q, "q")
    q_arr = check_float_array("q", q_np, ndim=3)
    if q_arr.dtype.name not in MLA_DTYPES:
        fail("q.dtype", f"be one of {MLA_DTYPES}", q_arr.dtype.name)
    T, H, width = q_arr.shape
    if width != R + P:
        fail("q", f"have shape (T, H, kv_lora_rank + qk_rope_head_dim = {R + P})", f"shape {q_arr.shape}")
    if not 1 <= H <= MAX_MLA_HEADS:
        fail("q", f"have 1 <= H <= {MAX_MLA_HEADS} query heads (q.shape[1])", f"H = {H}")
    if is_block_kv(kv_cache):
        raise NotImplementedError("mla_paged_attention: an MLA cache holds one latent entry per "
                                  "token, not a (key_cache, value_cache) pair; pass the "
                                  "(num_blocks, block_size, entry_size) latent cache")
    cache, _ = to_numpy(kv_cache, "kv_cache")
    N, B, E = check_mla_cache("kv_cache", cache, min_entry=R + P)
    if cache.dtype != q_arr.dtype:
        fail("kv_cache.dtype", f"equal q.dtype ({q_arr.dtype.name})", cache.dtype.name)
    if N * B > _INT32_MAX:
        raise NotImplementedError(f"kv_cache: num_blocks * block_size = {N * B} exceeds the int32 "
                                  "row-index range; split the cache into smaller tensors")

    return mla_batch(block_tables, query_lens, context_lens, num_tokens=T, num_heads=H,
                     num_blocks=N, block_size=B, entry_size=E, kv_lora_rank=R,
                     qk_rope_head_dim=P, softmax_scale=softmax_scale, dtype=q_arr.dtype.name)


def mla_batch(block_tables: Any, query_lens: Any, context_lens: Any, *, num_tokens: int | None,
              num_heads: int, num_blocks: int, block_size: int, entry_size: int,
              kv_lora_rank: int, qk_rope_head_dim: int, softmax_scale: float | None,
              dtype: str) -> MLAPlan:
    """The :class:`MLAPlan` of checked geometry (H, N, B, E, R, P, dtype) and the batch:
    validates the lengths (summing to ``num_tokens`` when given), the block tables and the
    scale, as :func:`check_mla_inputs` does after its tensor checks."""
    T, H, N, B, E = num_tokens, num_heads, num_blocks, block_size, entry_size
    R, P = kv_lora_rank, qk_rope_head_dim
    qlens = check_lens("query_lens", query_lens, min_value=1)
    if qlens.shape[0] == 0:
        fail("query_lens", "have at least one entry (one per sequence)", "0 entries")
    if T is None:
        T = int(qlens.sum())
    if int(qlens.sum()) != T:
        fail("query_lens", f"sum to q.shape[0] = {T}", f"sum {int(qlens.sum())}")
    S = qlens.shape[0]
    clens = check_lens("context_lens", context_lens, min_value=1, length=S, length_arg="query_lens")
    short = np.flatnonzero(clens < qlens)
    if short.size:
        i = int(short[0])
        fail("context_lens", "be >= query_lens (context_lens includes the new tokens, already in "
             "kv_cache)", f"context_lens[{i}] = {int(clens[i])} < query_lens[{i}] = {int(qlens[i])}")

    bt = check_integer_array("block_tables", block_tables, ndim=2)
    nblk = check_block_tables(bt, clens, block_size=B, num_blocks=N)
    scale = check_softmax_scale(softmax_scale, 1.0 / math.sqrt(R + P))

    offsets = np.concatenate([[0], np.cumsum(qlens)[:-1]]).astype(np.int64)
    return MLAPlan(num_tokens=T, num_heads=H, num_blocks=N, block_size=B, entry_size=E,
                   kv_lora_rank=R, qk_rope_head_dim=P, num_seqs=S,
                   query_lens=readonly(qlens.copy()), context_lens=readonly(clens.copy()),
                   query_offsets=readonly(offsets), context_blocks=readonly(nblk.astype(np.int64)),
                   softmax_scale=scale, dtype=dtype)
