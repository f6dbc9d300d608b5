"""Independent float64 reference for MLA (multi-head latent attention) decode / prefill over a paged
latent cache, written from the definition.

It shares NO code with the MLA cache builders (host/cache/mla_layout.py, host/cache/mla_cache.py) nor with
host/mla/mla.py's input plan -- only the argument checks in host/validation.py -- so a layout bug in a
builder cannot pass both the kernel and this reference.

Convention (differs from :func:`host.paged_attention_ref`): the new tokens are ALREADY in the
cache (written first with ``concat_and_cache_mla``), and ``context_lens[i]`` counts ALL of
sequence i's tokens in the cache, its ``query_lens[i]`` new ones included; they are its last
``query_lens[i]`` tokens. For sequence i (c = context_lens[i], n = query_lens[i]):

    entry(j)  = kv_cache[block_tables[i, j // B], j % B, :]       token position j in [0, c)
    key(j)    = entry(j)[0 : R + P]                                [kv_c | k_pe], R + P elements
    value(j)  = entry(j)[0 : R]                                    kv_c (R = kv_lora_rank)
    new token a (0 <= a < n) is at position c - n + a and sees positions j <= c - n + a
    out[a, h] = sum_j softmax_j(scale * q[a, h] . key(j)) * value(j)     (T, H, R), float64

One latent "KV head" is shared by all H query heads (the query is already absorbed into the latent
space: q = [q_nope W_UK | q_pe], R + P elements per head). Padding elements [R + P, E) of an entry
are never read.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from host._arrays import from_numpy_like, to_numpy
from host.validation import (check_block_tables, check_float_array, check_int, check_integer_array,
                             check_lens, check_shape, check_softmax_scale, fail)

__all__ = ["mla_paged_attention_ref"]


def mla_paged_attention_ref(q: Any, kv_cache: Any, block_tables: Any, query_lens: Any,
                            context_lens: Any, *, kv_lora_rank: int = 512, qk_rope_head_dim: int = 64,
                            softmax_scale: float | None = None) -> Any:
    """float64 MLA attention from the definition (module docstring).

    Args:
        q: (T, H, kv_lora_rank + qk_rope_head_dim) float, T = sum(query_lens), sequences
            contiguous and in order.
        kv_cache: (N, B, E) float, E >= kv_lora_rank + qk_rope_head_dim; entry = [kv_c | k_pe | pad].
        block_tables: (S, max_blocks) integer; row i's first ceil(context_lens[i] / B) entries are
            sequence i's blocks (ids in [0, N)); later entries are ignored.
        query_lens: (S,) integer >= 1, new tokens per sequence.
        context_lens: (S,) integer >= query_lens: ALL tokens of sequence i in the cache, INCLUDING
            its query_lens[i] new tokens (its last ones). Not the host.paged_attention convention,
            where context_lens excludes the new tokens.
        kv_lora_rank, qk_rope_head_dim: R and P (DeepSeek V2/V3: 512 and 64).
        softmax_scale: default 1 / sqrt(kv_lora_rank + qk_rope_head_dim) (the key length). DeepSeek
            passes its own (1 / sqrt(qk_nope_head_dim + qk_rope_head_dim), times a YaRN factor).

    Returns:
        (T, H, kv_lora_rank) float64 (a torch float64 tensor if ``q`` was torch): the attention
        output in the latent space (the caller applies W_UV and W_O).
    """
    q_arr, was_torch = to_numpy(q, "q")
    q_all = check_float_array("q", q_arr, ndim=3)
    cache = check_float_array("kv_cache", kv_cache, ndim=3)
    bt = check_integer_array("block_tables", block_tables, ndim=2)
    R = check_int("kv_lora_rank", kv_lora_rank, min_value=1)
    P = check_int("qk_rope_head_dim", qk_rope_head_dim, min_value=1)
    qlens = check_lens("query_lens", query_lens, min_value=1)
    clens = check_lens("context_lens", context_lens, min_value=1, length=qlens.shape[0],
                       length_arg="query_lens")
    T, H, _ = q_all.shape
    check_shape("q", q_all, (None, None, R + P), "(T, H, kv_lora_rank + qk_rope_head_dim)")
    N, B, E = cache.shape
    if E < R + P or N < 1 or B < 1:
        fail("kv_cache", f"have shape (N >= 1, B >= 1, E >= {R + P})", f"shape {cache.shape}")
    if int(qlens.sum()) != T:
        fail("query_lens", f"sum to q.shape[0] = {T}", f"sum {int(qlens.sum())}")
    if (clens < qlens).any():
        i = int(np.argmax(clens < qlens))
        fail("context_lens", "be >= query_lens (they include the new tokens)",
             f"context_lens[{i}] = {int(clens[i])} < query_lens[{i}] = {int(qlens[i])}")
    S = qlens.shape[0]
    check_block_tables(bt, clens, block_size=B, num_blocks=N)
    scale = check_softmax_scale(softmax_scale, 1.0 / math.sqrt(R + P))

    out = np.zeros((T, H, R), dtype=np.float64)
    start = 0
    for i in range(S):                                             # naive per-sequence loop
        n, c = int(qlens[i]), int(clens[i])
        pos = np.arange(c)
        entries = cache[bt[i, pos // B], pos % B].astype(np.float64)   # (c, E)
        keys, values = entries[:, :R + P], entries[:, :R]
        qs = q_all[start:start + n].astype(np.float64)              # (n, H, R + P)
        scores = (qs.transpose(1, 0, 2) @ keys.T) * scale            # (H, n, c)
        visible = pos[None, :] <= (c - n + np.arange(n))[:, None]  # (n, c) causal
        scores = np.where(visible[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out[start:start + n] = (p @ values).transpose(1, 0, 2)
        start += n
    return from_numpy_like(out, was_torch, like=q)
