"""Launch wrappers for the paged-attention kernels: run a plan per layer, and vLLM's wrapper.

``run_paged_attention(plan, ...)``  one layer of a step: checks the layer's tensors fit the
                              plan (``host.plan_paged_attention``), builds only the per-layer
                              kernel inputs (packed Q^T, the overlay / padded Q, K, V), launches,
                              unpacks: (T, H, d) out.
``paged_attention``           user-facing one-shot: (T, H, d) tokens in, (T, H, d) out; plan + run.
``flash_attn_varlen_nkifunc`` vLLM-compatible: kernel-layout tensors in, kernel output out.

Backends (``backend=``): ``host.launch`` ("auto" | "sim" | "neuron").

Dimensions: S sequences, T = sum(query_lens) tokens, Qpad padded tokens (multiple of 128),
H / Hkv query / KV heads, d head size, N cache blocks, B block size.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from host._arrays import from_numpy_like, is_torch_tensor, to_numpy
from host.cache.block_kv import check_pair, is_block_kv, kv_dims
from host.fp8 import is_fp8_cache_dtype, kernel_cache_view
from host.dense.gqa_packing import pack_kv, pack_query, unpack_output
from host.launch import BACKENDS, check_api, check_lnc, launch_kernel
from host.scheduled.scheduled import build_overlay, launch_args, pack_queries, pair_launch_args
from host.scheduled.scheduled import unpack_output as unpack_class_output
from host.step_plan import (DTYPES, GQA_PACKING, KERNELS, AttentionPlan, check_attention_options,
                            layer_launches, plan_paged_attention)
from host.validation import (check_float_array, check_int, check_integer_array, check_ndim,
                             check_query_total, check_shape, fail)
from nki_kernels.contract import BLOCK_KV, FUSED

__all__ = ["paged_attention", "run_paged_attention", "flash_attn_varlen_nkifunc",
           "check_attention_tensors", "BACKENDS", "GQA_PACKING", "KERNELS"]


def paged_attention(query: Any, key: Any, value: Any, kv_cache: Any, block_tables: Any,
                    query_lens: Any, context_lens: Any, *, softmax_scale: float | None = None,
                    mixed_precision: bool = True, large_tile_size: Any = "auto",
                    backend: str = "auto", gqa_packing: Any = "auto",
                    kernel: str = "scheduled", sliding_window: int | None = None,
                    logits_soft_cap: float | None = None, alibi_slopes: Any = None,
                    sinks: Any = None, k_scale: Any = None, v_scale: Any = None,
                    partial_tile_size: Any = "auto", api: str | None = None,
                    lnc: int | None = None) -> Any:
    """Paged attention of a flat batch of new tokens against their cached context and themselves.

    Same arguments and result shape as ``host.reference.paged_attention_ref``. One call is
    ``run_paged_attention(plan_paged_attention(...), query, key, value, kv_cache)``; a model
    that runs one batch through many layers plans once per step and runs per layer instead.

    Args:
        query: (T, H, d) float32/bfloat16/float16; sequences contiguous and in order.
        key, value: (T, Hkv, d), the new tokens' K/V, same dtype as query.
        kv_cache: (2, N, Hkv, B, d), same dtype, or an fp8 cache (float8_e4m3fn / float8_e5m2,
            scheduled kernel, with k_scale / v_scale); [0] = K, [1] = V (not modified). Or
            vLLM's block-KV layout (scheduled kernel, query dtype): a ``(key_cache,
            value_cache)`` pair of C-contiguous (N, B, Hkv, d) caches, read in place without a
            copy (docs/layouts.md §18).
        block_tables: (S, max_blocks) integer; row i's first ceil(context_lens[i] / B) entries
            are sequence i's context blocks (ids in [0, N)); later entries are ignored.
        query_lens: (S,) integers >= 1 summing to T.  context_lens: (S,) integers >= 0.
        softmax_scale: default 1/sqrt(d).
        mixed_precision: bf16 matmuls with fp32 statistics (True) or the input dtype (False).
        large_tile_size: context tokens per KV tile, a power of two in [512, 8192], or "auto":
            2048 (vLLM's LARGE_TILE_SZ default), except that the scheduled kernel, which
            resolves it per class of sequences (decode / prefill, one launch each), widens the
            tiles of a class of single-row decodes (every sequence's G * q_len <= 8 rows, no
            sliding window) until a cache row holds min(B, 32) tokens (block 32: 4096;
            ``host.scheduled.schedule_items.choose_large_tile``, docs/layouts.md §16.3).
        partial_tile_size: scheduled kernel: keys per tile of the masked (partial) items, a power
            of two in [512, large_tile_size], or "auto" (the host picks one per class,
            docs/layouts.md §16.3). Fix it to bound the kernel shapes a serving engine compiles.
        backend: "auto" | "sim" | "neuron" (``host.launch``).
        api: the NKI API the kernel runs on: "legacy" (``neuronxcc.nki``, trn1) or "nki" (the
            current API, trn2 / trn3); None / "auto": ``NKI_PA_API`` or the automatic choice of
            ``nki_kernels.toolchain.resolve_api``. Both kernels run on both APIs.
        lnc: physical cores per launch, 1 or 2 (trn2 / trn3: the KV heads split between the
            two cores of a logical core; scheduled kernel: an odd Hkv, e.g. 1, splits each
            class's query groups instead, docs/layouts.md §16.3 "Item parts"; dense kernel: an
            odd Hkv split between the cores by query tiles, the last head on the current API,
            every head on the legacy API); None:
            ``NEURON_LOGICAL_NC_CONFIG``, else the platform's (``nki_kernels.toolchain.Api.lnc``).
        kernel: "scheduled" (default) runs ``nki_kernels.scheduled.scheduled_attention`` through a host
            schedule (``host.scheduled.schedule``): only (query block, KV tile) pairs of the same sequence,
            masks built in-kernel from per-row bounds, the G query heads of a KV head packed as
            query rows. "dense" runs the vLLM-interface kernel ``flash_paged_attention`` (every
            128-row query tile against every context tile, a dense host-built mask).
        sliding_window, logits_soft_cap, alibi_slopes, sinks, k_scale, v_scale: attention
            variants (scheduled kernel only; definitions in docs/attention-variants.md, checked by
            ``host.variants.make_variants``): a query at position p sees keys p-W+1 .. p; scores
            s -> c * tanh(s / c); s += slope_h * (key_pos - query_pos); one extra logit sink_h per
            head in the softmax denominator; an fp8 cache holds K / k_scale and V / v_scale
            (per tensor or per KV head).
        gqa_packing: "auto" | True | False (dense kernel only; the scheduled kernel always packs
            the heads of a KV head as rows). True runs the dense kernel with each KV head's G query
            heads packed as extra query rows (``host.dense.gqa_packing``, docs/layouts.md §11): fewer
            Q-tile passes for decode-heavy batches. "auto" packs when
            ``host.dense.gqa_packing.choose_gqa_packing`` says it does less work (never when G == 1,
            where packing is a no-op).

    Returns:
        (T, H, d) in query's dtype; a torch tensor if ``query`` was one. Inputs are never modified.

    Raises:
        ValueError: bad shapes, dtypes, lengths, block ids or options (names the argument).
        RuntimeError: backend="neuron" without the real Neuron toolchain.
    """
    was_torch = is_torch_tensor(query)
    q, k, v, cache = check_attention_tensors(query, key, value, kv_cache)
    T, H, d = q.shape
    check_query_total(query_lens, T)
    N, B, Hkv, _ = kv_dims(cache)
    block_kv = is_block_kv(cache)
    plan = plan_paged_attention(block_tables, query_lens, context_lens, num_heads=H,
                                num_kv_heads=Hkv, head_size=d, block_size=B, num_blocks=N,
                                dtype=q.dtype,
                                kv_cache_dtype=(cache[0] if block_kv else cache).dtype,
                                kv_layout=BLOCK_KV if block_kv else FUSED,
                                softmax_scale=softmax_scale, mixed_precision=mixed_precision,
                                large_tile_size=large_tile_size, partial_tile_size=partial_tile_size,
                                backend=backend, gqa_packing=gqa_packing, kernel=kernel,
                                sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                                alibi_slopes=alibi_slopes, sinks=sinks, k_scale=k_scale,
                                v_scale=v_scale, api=api, lnc=lnc)
    if plan.num_tokens != T:
        fail("query_lens", f"sum to query.shape[0] = {T}", f"sum {plan.num_tokens}")
    return from_numpy_like(_run(plan, q, k, v, cache, {}), was_torch, like=query)


def check_attention_tensors(query: Any, key: Any, value: Any, kv_cache: Any) -> tuple:
    """``host.paged_attention``'s tensor checks: ``(query, key, value, kv_cache)`` as NumPy,
    query (T, H, d) float32/bfloat16/float16, key / value (T, Hkv, d) and a (2, N, Hkv, B, d)
    cache in query's dtype (or fp8), or a block-KV ``(key_cache, value_cache)`` pair of
    (N, B, Hkv, d) caches in query's dtype (returned as a tuple of arrays sharing the callers'
    memory). ValueError naming the tensor otherwise."""
    q_np, _ = to_numpy(query, "query")
    q = check_float_array("query", q_np, ndim=3)
    k = check_float_array("key", key, ndim=3)
    v = check_float_array("value", value, ndim=3)
    if is_block_kv(kv_cache):
        return (q, k, v) + (_check_pair_tensors(q, k, v, kv_cache),)
    cache_np, _ = to_numpy(kv_cache, "kv_cache")
    fp8_cache = is_fp8_cache_dtype(cache_np.dtype)
    cache = cache_np if fp8_cache else check_float_array("kv_cache", cache_np, ndim=5)
    check_ndim("kv_cache", cache, 5)
    T, H, d = q.shape
    _check_dtype("query", q)
    for name, arr in (("key", k), ("value", v)) + (() if fp8_cache else (("kv_cache", cache),)):
        if arr.dtype != q.dtype:
            fail(f"{name}.dtype", f"equal query.dtype ({q.dtype.name})", arr.dtype.name)
    check_shape("kv_cache", cache, (2, None, None, None, d), "(2, num_blocks, Hkv, block_size, d)")
    if 0 in cache.shape[1:]:
        fail("kv_cache", "have num_blocks, Hkv, block_size and d >= 1",
             f"shape {tuple(cache.shape)}")
    Hkv = cache.shape[2]
    check_shape("key", k, (T, Hkv, d), "(T, Hkv, d) matching query and kv_cache")
    check_shape("value", v, (T, Hkv, d), "(T, Hkv, d) matching query and kv_cache")
    return q, k, v, cache


def _check_pair_tensors(q, k, v, kv_cache) -> tuple:
    """The block-KV pair against query / key / value (``check_attention_tensors``)."""
    kc, vc = check_pair("kv_cache", kv_cache)
    T, H, d = q.shape
    _check_dtype("query", q)
    for name, arr in (("key", k), ("value", v), ("kv_cache[0] (key_cache)", kc)):
        if arr.dtype != q.dtype:
            fail(f"{name}.dtype", f"equal query.dtype ({q.dtype.name})", arr.dtype.name)
    if kc.shape[3] != d:
        fail("kv_cache[0] (key_cache)", f"have shape (num_blocks, block_size, Hkv, d) with d = "
             f"query.shape[2] = {d}", f"shape {kc.shape}")
    if 0 in kc.shape:
        fail("kv_cache[0] (key_cache)", "have num_blocks, block_size, Hkv and d >= 1",
             f"shape {tuple(kc.shape)}")
    Hkv = kc.shape[2]
    check_shape("key", k, (T, Hkv, d), "(T, Hkv, d) matching query and kv_cache")
    check_shape("value", v, (T, Hkv, d), "(T, Hkv, d) matching query and kv_cache")
    return kc, vc


def _layer_cache(plan: AttentionPlan, kv_cache: Any) -> Any:
    """``kv_cache`` of one layer checked against the plan's layout, geometry and dtype."""
    if plan.kv_layout == BLOCK_KV:
        if not is_block_kv(kv_cache):
            fail("kv_cache", "be a (key_cache, value_cache) pair of (N, B, Hkv, d) caches: the "
                 "plan was built with kv_layout='block_kv'", type(kv_cache).__name__)
        pair = check_pair("kv_cache", kv_cache)
        shape = (plan.num_blocks, plan.block_size, plan.num_kv_heads, plan.head_size)
        return tuple(_fit(f"kv_cache[{i}] ({n})", c, shape, plan.kv_cache_dtype,
                          "(num_blocks, block_size, Hkv, d) of the plan")
                     for i, (n, c) in enumerate(zip(("key_cache", "value_cache"), pair)))
    if is_block_kv(kv_cache):
        fail("kv_cache", "be one (2, N, Hkv, B, d) array: the plan was built with "
             "kv_layout='fused' (plan with kv_layout='block_kv' for a (key_cache, value_cache) "
             "pair)", "a (key_cache, value_cache) pair")
    return _fit("kv_cache", to_numpy(kv_cache, "kv_cache")[0],
                (2, plan.num_blocks, plan.num_kv_heads, plan.block_size, plan.head_size),
                plan.kv_cache_dtype, "(2, num_blocks, Hkv, block_size, d) of the plan")


def run_paged_attention(plan: AttentionPlan, query: Any, key: Any, value: Any, kv_cache: Any, *,
                        alibi_slopes: Any = None, sinks: Any = None, k_scale: Any = None,
                        v_scale: Any = None, api: str | None = None) -> Any:
    """One layer of a planned step: ``(T, H, d)`` attention output.

    Args:
        plan: from ``host.plan_paged_attention`` (never modified; may be shared by threads).
        query (T, H, d), key / value (T, Hkv, d) in ``plan.dtype``; kv_cache (2, N, Hkv, B, d)
            in ``plan.kv_cache_dtype`` (not modified): T, H, Hkv, d, N, B those of the plan;
            with ``plan.kv_layout == "block_kv"`` a (key_cache, value_cache) pair of
            C-contiguous (N, B, Hkv, d) caches instead (read in place, no copy).
        alibi_slopes, sinks, k_scale, v_scale: this layer's values of the variants the plan was
            built with (default: the plan's); given only for variants the plan has.
        api: the NKI API of this layer's launches ("legacy" | "nki"; None: the plan's). The
            plan's inputs are the same for both APIs.

    Returns:
        (T, H, d) in query's dtype; a torch tensor if ``query`` was one.

    Raises:
        ValueError: a tensor that does not fit the plan (names the argument, the plan's
            constraint and the value), or a bad per-layer variant value.
    """
    if not isinstance(plan, AttentionPlan):
        fail("plan", "be an AttentionPlan from host.plan_paged_attention", type(plan).__name__)
    q_np, was_torch = to_numpy(query, "query")
    q = _fit("query", q_np, (plan.num_tokens, plan.num_heads, plan.head_size), plan.dtype,
             "(T, H, d) of the plan")
    kv_shape = (plan.num_tokens, plan.num_kv_heads, plan.head_size)
    k = _fit("key", to_numpy(key, "key")[0], kv_shape, plan.dtype, "(T, Hkv, d) of the plan")
    v = _fit("value", to_numpy(value, "value")[0], kv_shape, plan.dtype, "(T, Hkv, d) of the plan")
    cache = _layer_cache(plan, kv_cache)
    layer = dict(alibi_slopes=alibi_slopes, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    if api is not None:
        plan = dataclasses.replace(plan, api=check_api(api))
    return from_numpy_like(_run(plan, q, k, v, cache, layer), was_torch, like=query)


def _run(plan: AttentionPlan, q, k, v, cache, layer: dict) -> np.ndarray:
    """Tensors that fit ``plan`` (NumPy) -> (T, H, d) NumPy output."""
    if plan.kernel == "dense":
        given = sorted(n for n, x in layer.items() if x is not None)
        if given:
            fail(given[0], "be None with a dense-kernel plan (no attention variants)", "a value")
        return _run_dense(plan, q, k, v, cache)
    return _run_scheduled(plan, q, k, v, cache, layer)


def _fit(name: str, arr: np.ndarray, shape: tuple, dtype: str, what: str) -> np.ndarray:
    if arr.shape != shape:
        fail(name, f"have shape {shape} {what}", f"shape {arr.shape}")
    if arr.dtype.name != dtype:
        fail(f"{name}.dtype", f"be the plan's {dtype}", arr.dtype.name)
    return arr


def _run_scheduled(plan, query, key, value, kv_cache, layer) -> np.ndarray:
    """The scheduled kernel on one layer: per class, its overlay and packed Q^T, launch,
    scatter."""
    from nki_kernels.scheduled.scheduled_attention import scheduled_paged_attention
    from nki_kernels.scheduled.scheduled_pair import scheduled_pair_attention

    variants, launches = layer_launches(plan, **layer)
    Hkv = plan.num_kv_heads
    extra = {}
    if plan.kv_layout == BLOCK_KV:          # the callers' arrays, in place (docs/layouts.md §18)
        cache, kv_arg = kv_cache, kv_cache[0]
        extra["value_cache"] = kv_cache[1]
    else:
        cache = kv_arg = kernel_cache_view(np.ascontiguousarray(kv_cache))
    fp8 = variants is not None and variants.is_fp8
    scales = (variants.k_scale, variants.v_scale) if fp8 else None
    result = np.zeros((plan.num_tokens, plan.num_heads, plan.head_size), dtype=query.dtype)
    built = []
    for part, launch in zip(plan.parts, launches):
        overlay = build_overlay(part.schedule, cache, key, value, plan.block_tables,
                                dtype=plan.kernel_dtype if fp8 else None, kv_scale=scales)
        qt = pack_queries(launch.cls, query, Hkv, k_scale=scales[0] if fp8 else None)
        built.append(launch_args(launch, qt, kv_arg, overlay))
    run = dict(grid_heads=Hkv, backend=plan.backend, api=plan.api, lnc=plan.lnc,
               item_parts=launches[0].cls.item_parts)
    if plan.fused:        # both classes in one launch (plan.fused)
        args, inputs = pair_launch_args(*built)
        first, second = (part.kernel_kwargs["options"] for part in plan.parts)
        outs = launch_kernel(scheduled_pair_attention, args,
                             {"options": first, "options_b": second, **extra, **inputs}, **run)
    else:
        outs = [launch_kernel(scheduled_paged_attention, args,
                              {**part.kernel_kwargs, **extra, **inputs}, **run)
                for part, (args, inputs) in zip(plan.parts, built)]
    for launch, out in zip(launches, outs):
        unpack_class_output(launch.cls, np.asarray(out), result,
                            v_scale=scales[1] if fp8 else None)
    return result


def _run_dense(plan, query, key, value, kv_cache) -> np.ndarray:
    """The dense kernel on one layer: (GQA-packed) Q/K/V zero-padded to Qpad and transposed to
    the kernel layouts (docs/layouts.md), launch on grid [1, Hkv], unpad (and unpack)."""
    from nki_kernels.dense.flash_paged_attention import flash_paged_attention

    dense, Hkv, H = plan.dense, plan.num_kv_heads, plan.num_heads
    q, k, v = query, key, value
    if dense.gqa_packed:
        G = H // Hkv
        q, k, v = pack_query(q, Hkv), pack_kv(k, G), pack_kv(v, G)
    T, Hq, d = q.shape
    Qpad = dense.batch.padded_queries
    q_in = np.zeros((1, Hq, d, Qpad), dtype=q.dtype)
    q_in[0, :, :, :T] = q.transpose(1, 2, 0)
    k_in = np.zeros((1, Hkv, d, Qpad), dtype=q.dtype)
    k_in[0, :, :, :T] = k.transpose(1, 2, 0)
    v_in = np.zeros((1, Hkv, Qpad, d), dtype=q.dtype)
    v_in[0, :, :T, :] = v.transpose(1, 0, 2)
    out = launch_kernel(flash_paged_attention,
                        (q_in, k_in, v_in, np.ascontiguousarray(kv_cache), dense.active_table,
                         dense.mask), dict(plan.kernel_kwargs), grid_heads=Hkv,
                        backend=plan.backend, api=plan.api, lnc=plan.lnc)
    result = np.ascontiguousarray(np.asarray(out)[0, :, :T, :].transpose(1, 0, 2))
    return unpack_output(result, H) if Hq != H else result


def flash_attn_varlen_nkifunc(query: Any, key: Any, value: Any, kv_cache: Any, block_table: Any,
                              attn_mask: Any, n_kv_head: int | None = None,
                              head_size: int | None = None, LARGE_TILE_SZ: int = 2048,
                              mixed_precision: bool = True, *, backend: str = "auto",
                              api: str | None = None, lnc: int | None = None) -> Any:
    """vLLM's wrapper (``vllm/attention/ops/nki_flash_attn.py``, fused-cache form): kernel layouts.

    Args:
        query: (1, H, d, Qpad); key: (1, Hkv, d, Qpad); value: (1, Hkv, Qpad, d); Qpad a
            multiple of 128 (vLLM pads to its compile buckets), same float dtype throughout.
        kv_cache: (2, N, Hkv, B, d).
        block_table: (num_active_blocks,) integer ids (converted to int32), a multiple of
            LARGE_TILE_SZ // B entries (zero allowed: no context).
        attn_mask: (Qpad, num_active_blocks*B + Qpad) bool, or integer 0/1 (vLLM documents int32),
            context part already reordered (``host.dense.masks.reorder_context_mask``).
        n_kv_head, head_size: optional; must match kv_cache.shape[2] / kv_cache.shape[4].
        LARGE_TILE_SZ, mixed_precision: as the kernel. softmax_scale is 1/sqrt(head_size).
        backend, api, lnc: as :func:`paged_attention` (keyword-only extensions; ``lnc`` None
            is ``NEURON_LOGICAL_NC_CONFIG`` or the platform's: on trn2 the KV heads split
            between the two cores of the logical core).

    Returns:
        (1, H, Qpad, d) in query's dtype -- the kernel output, NOT unpadded or transposed (as in
        vLLM, the caller permutes it to (Qpad, H, d) and slices the real tokens). torch in,
        torch out (decided by ``query``).

    Raises:
        ValueError / NotImplementedError: from the checks here and in the kernel.
    """
    if is_block_kv(kv_cache):
        raise NotImplementedError(
            "flash_attn_varlen_nkifunc (the dense vLLM-interface kernel) reads a fused "
            "(2, N, Hkv, B, d) kv_cache only; for a (key_cache, value_cache) pair of (N, B, Hkv, "
            "d) caches use host.paged_attention / host.run_paged_attention (scheduled kernel)")
    q_np, was_torch = to_numpy(query, "query")
    q = check_float_array("query", q_np, ndim=4)
    k = check_float_array("key", key, ndim=4)
    v = check_float_array("value", value, ndim=4)
    cache = check_float_array("kv_cache", kv_cache, ndim=5)
    _check_dtype("query", q)
    if cache.shape[0] != 2 or 0 in cache.shape:
        fail("kv_cache", "have shape (2, num_blocks, Hkv, block_size, d), each >= 1",
             f"shape {cache.shape}")
    _, N, Hkv, B, d = cache.shape
    _check_dense_layouts(q, k, v, cache)
    if n_kv_head is not None and n_kv_head != Hkv:
        fail("n_kv_head", f"equal kv_cache.shape[2] = {Hkv}", repr(n_kv_head))
    if head_size is not None and head_size != d:
        fail("head_size", f"equal kv_cache.shape[4] = {d}", repr(head_size))
    check_attention_options(kernel="dense", num_heads=q.shape[1], num_kv_heads=Hkv, head_size=d,
                            num_blocks=N, mixed_precision=mixed_precision, backend=backend,
                            gqa_packing="auto")
    api = check_api(api)
    check_lnc(api, lnc, Hkv)
    LARGE_TILE_SZ = check_int("LARGE_TILE_SZ", LARGE_TILE_SZ, min_value=1)
    bt = check_integer_array("block_table", block_table, ndim=1)
    if bt.size and (bt.min() < 0 or bt.max() >= N):
        bad = int(np.argmax((bt < 0) | (bt >= N)))
        fail("block_table", f"hold block ids in [0, {N})", f"block_table[{bad}] = {int(bt[bad])}")
    if LARGE_TILE_SZ % B:
        fail("LARGE_TILE_SZ", f"be a multiple of block_size = {B}", repr(LARGE_TILE_SZ))
    if bt.size % (LARGE_TILE_SZ // B):
        fail("block_table", f"have a multiple of LARGE_TILE_SZ // block_size = "
             f"{LARGE_TILE_SZ} // {B} entries", f"{bt.size} entries")
    m_np, _ = to_numpy(attn_mask, "attn_mask")
    if m_np.dtype != np.bool_:
        if m_np.dtype.kind not in "iu":
            fail("attn_mask", "be bool or integer 0/1", f"dtype {m_np.dtype}")
        if m_np.size and not np.isin(m_np, (0, 1)).all():
            fail("attn_mask", "hold only 0 and 1 when integer", "other values")
        m_np = m_np.astype(bool)
    Qpad = q.shape[3]
    check_shape("attn_mask", m_np, (Qpad, bt.size * B + Qpad),
                "(Qpad, num_active_blocks * block_size + Qpad)")
    from nki_kernels.dense.flash_paged_attention import flash_paged_attention

    args = (np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
            np.ascontiguousarray(cache), bt.astype(np.int32), np.ascontiguousarray(m_np))
    kwargs = dict(softmax_scale=1.0 / math.sqrt(d), mixed_precision=bool(mixed_precision),
                  LARGE_TILE_SZ=LARGE_TILE_SZ)
    out = launch_kernel(flash_paged_attention, args, kwargs, grid_heads=Hkv, backend=backend,
                        api=api, lnc=lnc)
    return from_numpy_like(np.asarray(out), was_torch, like=query)


def _check_dense_layouts(q: np.ndarray, k: np.ndarray, v: np.ndarray, cache: np.ndarray) -> None:
    """``flash_attn_varlen_nkifunc``'s kernel layouts: query (1, H, d, Qpad), key (1, Hkv, d,
    Qpad), value (1, Hkv, Qpad, d) with Qpad a multiple of 128, d and Hkv those of kv_cache (2,
    N, Hkv, B, d), one float dtype (kv_cache too)."""
    _, _, Hkv, _, d = cache.shape
    Qpad = q.shape[3]
    if q.shape[0] != 1 or q.shape[2] != d or Qpad % 128 or Qpad == 0:
        fail("query", f"have shape (1, H, d, Qpad) with d = kv_cache.shape[4] = {d} and Qpad a "
             "positive multiple of 128", f"shape {q.shape}")
    check_shape("key", k, (1, Hkv, d, Qpad), "(1, Hkv, d, Qpad) matching query and kv_cache")
    check_shape("value", v, (1, Hkv, Qpad, d), "(1, Hkv, Qpad, d) matching query and kv_cache")
    for name, arr in (("key", k), ("value", v), ("kv_cache", cache)):
        if arr.dtype != q.dtype:
            fail(f"{name}.dtype", f"equal query.dtype ({q.dtype.name})", arr.dtype.name)


def _check_dtype(name: str, arr: np.ndarray) -> None:
    if arr.dtype.name not in DTYPES:
        fail(f"{name}.dtype", f"be one of {DTYPES}", arr.dtype.name)
