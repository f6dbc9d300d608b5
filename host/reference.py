"""Independent float64 reference for paged attention over a flat batch.

Written straight from the definition and sharing NO code with host/dense/plan.py, host/dense/masks.py or
host/dense/block_tables.py (only the argument checks in host/validation.py): a mask or block-table bug
in the kernel-input builders therefore cannot pass both the kernel and this reference.

For each sequence i (tokens contiguous and in order in ``query``/``key``/``value``):
    context K/V: token j (0 <= j < ctx_i) is kv_cache[0|1, block_tables[i, j // B], :, j % B, :]
    keys = [context K ; new K of sequence i]            (ctx_i + q_i, Hkv, d)
    query a (0 <= a < q_i) sees keys k <= ctx_i + a     (causal, bottom-right aligned)
    query head h uses KV head h // (H // Hkv)           (GQA; MQA when Hkv = 1)
    out = softmax(scale * q k^T) v                      in float64, scale = 1/sqrt(d) by default

Attention variants (docs/attention-variants.md; validated by host.variants.make_variants), for
query a of sequence i at absolute position p = ctx_i + a and key position k (0 <= k <= p), in
this order:
    fp8 cache      context K = k_fp8 * k_scale[kv head], V = v_fp8 * v_scale[kv head]
                   (the new tokens' key / value are used as given)
    s = scale * q . k
    alibi_slopes   s += slope_h * (k - p)
    soft cap c     s = c * tanh(s / c)
    mask           keys k <= p, and k > p - W with a sliding window W
    sinks          out = sum_k e^(s_k - m) v_k / (e^(sink_h - m) + sum_k e^(s_k - m))
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from host._arrays import from_numpy_like, to_numpy
from host.validation import (check_float_array, check_index_range, check_integer_array,
                             check_lens, check_shape, fail)
from host.variants import make_variants

__all__ = ["paged_attention_ref"]

_QUERY_CHUNK = 256      # query rows per score block (bounds the float64 (H, rows, K) temporaries)


def paged_attention_ref(query: Any, key: Any, value: Any, kv_cache: Any, block_tables: Any,
                        query_lens: Any, context_lens: Any, *,
                        softmax_scale: float | None = None, sliding_window: int | None = None,
                        logits_soft_cap: float | None = None, alibi_slopes: Any = None,
                        sinks: Any = None, k_scale: Any = None, v_scale: Any = None) -> Any:
    """float64 paged attention from the definition.

    Args:
        query: (T, H, d) float, T = sum(query_lens), sequences contiguous and in order.
        key, value: (T, Hkv, d) float, the new tokens' K/V.
        kv_cache: (2, N, Hkv, B, d) float; [0] = K, [1] = V. float8_e4m3fn / float8_e5m2 caches
            are dequantized with k_scale / v_scale.
        block_tables: (S, max_blocks) integer; row i's first ceil(ctx_i / B) entries are used.
        query_lens: (S,) integer >= 1. context_lens: (S,) integer >= 0.
        softmax_scale: float, default 1/sqrt(d).
        sliding_window, logits_soft_cap, alibi_slopes, sinks, k_scale, v_scale: the attention
            variants of host.variants.make_variants (all off by default).
    Returns:
        (T, H, d) float64 (a torch float64 tensor if ``query`` was torch).
    """
    q_arr, was_torch = to_numpy(query, "query")
    q_all = check_float_array("query", q_arr, ndim=3)
    k_new = check_float_array("key", key, ndim=3)
    v_new = check_float_array("value", value, ndim=3)
    cache = check_float_array("kv_cache", kv_cache, ndim=5)
    bt = check_integer_array("block_tables", block_tables, ndim=2)
    qlens = check_lens("query_lens", query_lens, min_value=1)
    clens = check_lens("context_lens", context_lens, min_value=0, length=qlens.shape[0],
                       length_arg="query_lens")

    T, H, d = q_all.shape
    if d < 1:
        fail("query", "have head size d = query.shape[2] >= 1", f"shape {q_all.shape}")
    check_shape("kv_cache", cache, (2, None, None, None, d), "(2, num_blocks, Hkv, block_size, d)")
    _, N, Hkv, B, _ = cache.shape
    if Hkv < 1 or B < 1:
        fail("kv_cache", "have num_kv_heads >= 1 and block_size >= 1", f"shape {cache.shape}")
    check_shape("key", k_new, (T, Hkv, d), "(T, Hkv, d) matching query and kv_cache")
    check_shape("value", v_new, (T, Hkv, d), "(T, Hkv, d) matching query and kv_cache")
    if H % Hkv:
        fail("query", f"have a head count divisible by num_kv_heads={Hkv}", f"H = {H}")
    if int(qlens.sum()) != T:
        fail("query_lens", f"sum to query.shape[0] = {T}", f"sum {int(qlens.sum())}")
    S = qlens.shape[0]
    check_shape("block_tables", bt, (S, None), "(num_seqs, max_blocks)")
    nblk = (clens + B - 1) // B
    if S and int(nblk.max()) > bt.shape[1]:
        i = int(np.argmax(nblk))
        fail("block_tables", f"have >= ceil(context_lens[{i}] / {B}) = {int(nblk[i])} columns",
             f"shape {bt.shape}")
    used = np.arange(bt.shape[1])[None, :] < nblk[:, None]       # entries the reference reads
    check_index_range("block_tables", np.where(used, bt, 0), upper=N, what="block ids (inside kv_cache)")
    variants = make_variants(H, Hkv, cache.dtype, sliding_window=sliding_window,
                             logits_soft_cap=logits_soft_cap, alibi_slopes=alibi_slopes, sinks=sinks,
                             k_scale=k_scale, v_scale=v_scale)
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        if isinstance(softmax_scale, (bool, np.bool_)) or \
                not isinstance(softmax_scale, (int, float, np.floating, np.integer)) or \
                not math.isfinite(float(softmax_scale)):
            fail("softmax_scale", "be a finite real number or None", repr(softmax_scale))
        scale = float(softmax_scale)

    kv_head_of = np.arange(H) // (H // Hkv)                      # GQA group mapping
    k_scale64 = None if variants.k_scale is None else variants.k_scale.astype(np.float64)[:, None]
    v_scale64 = None if variants.v_scale is None else variants.v_scale.astype(np.float64)[:, None]
    out = np.zeros((T, H, d), dtype=np.float64)
    start = 0
    for i in range(S):                                            # naive per-sequence loop
        qn, cn = int(qlens[i]), int(clens[i])
        j = np.arange(cn)
        blocks = bt[i, j // B]
        k_ctx = cache[0, blocks, :, j % B, :].astype(np.float64)  # (cn, Hkv, d)
        v_ctx = cache[1, blocks, :, j % B, :].astype(np.float64)
        if k_scale64 is not None:                                 # fp8 cache: dequantize
            k_ctx, v_ctx = k_ctx * k_scale64, v_ctx * v_scale64
        keys = np.concatenate([k_ctx, k_new[start:start + qn].astype(np.float64)])
        vals = np.concatenate([v_ctx, v_new[start:start + qn].astype(np.float64)])
        keys, vals = keys[:, kv_head_of, :], vals[:, kv_head_of, :]   # (cn+qn, H, d)
        k_t = np.ascontiguousarray(keys.transpose(1, 2, 0))      # (H, d, K)
        v_h = np.ascontiguousarray(vals.transpose(1, 0, 2))      # (H, K, d)
        k_pos = np.arange(cn + qn)[None, :]
        for a0 in range(0, qn, _QUERY_CHUNK):                     # bounded (H, rows, K) scores
            a1 = min(qn, a0 + _QUERY_CHUNK)
            qs = q_all[start + a0:start + a1].astype(np.float64)  # (rows, H, d)
            scores = (qs.transpose(1, 0, 2) @ k_t) * scale        # (H, rows, cn+qn)
            q_pos = cn + np.arange(a0, a1)[:, None]               # absolute positions
            if variants.alibi_slopes is not None:
                scores = scores + variants.alibi_slopes.astype(np.float64)[:, None, None] * (k_pos - q_pos)
            if variants.logits_soft_cap is not None:
                cap = variants.logits_soft_cap
                scores = cap * np.tanh(scores / cap)
            visible = k_pos <= q_pos
            if variants.sliding_window is not None:
                visible &= k_pos > q_pos - variants.sliding_window
            scores = np.where(visible[None], scores, -np.inf)
            m = scores.max(axis=-1, keepdims=True)                # finite: key p is always visible
            if variants.sinks is not None:
                sink = variants.sinks.astype(np.float64)[:, None, None]
                m = np.maximum(m, sink)
            p = np.exp(scores - m)
            denom = p.sum(axis=-1, keepdims=True)
            if variants.sinks is not None:
                denom = denom + np.exp(sink - m)
            out[start + a0:start + a1] = ((p / denom) @ v_h).transpose(1, 0, 2)
        start += qn
    return from_numpy_like(out, was_torch, like=query)
