"""Launch wrappers for the flash paged-attention kernel.

``paged_attention``           user-facing: (T, H, d) tokens in, (T, H, d) out; plans, builds the
                              kernel inputs (docs/layouts.md), launches, unpads.
``flash_attn_varlen_nkifunc`` vLLM-compatible: kernel-layout tensors in, kernel output out.

Backends (``backend=``): ``"sim"`` runs ``nki.simulate_kernel`` (the project's ``nki_sim``, or the
real toolchain's CPU simulator when neuronx-cc is installed); ``"neuron"`` runs the kernel on a
Trainium device (requires the real ``neuronxcc.nki``; ``nki.jit`` with NumPy arguments is
baremetal); ``"auto"`` is ``"neuron"`` when the real toolchain is active, else ``"sim"``.
Which NKI package is active is decided once by ``nki_kernels._nki`` (env ``NKI_PA_BACKEND``).

Dimensions: S sequences, T = sum(query_lens) tokens, Qpad padded tokens (multiple of 128),
H / Hkv query / KV heads, d head size, N cache blocks, B block size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from host._arrays import from_numpy_like, to_numpy
from host.block_tables import active_block_table
from host.gqa_packing import (choose_gqa_packing, pack_kv, pack_query, packed_attention_mask,
                              unpack_output)
from host.masks import build_attention_mask
from host.plan import make_plan
from host.scheduled import run_scheduled
from host.fp8 import is_fp8_cache_dtype, kernel_cache_view
from host.validation import (check_float_array, check_integer_array, check_ndim, check_power_of_two,
                             check_shape, fail)
from host.variants import make_variants

__all__ = ["paged_attention", "flash_attn_varlen_nkifunc", "BACKENDS", "GQA_PACKING", "KERNELS"]

BACKENDS = ("auto", "sim", "neuron")
GQA_PACKING = ("auto", True, False)
KERNELS = ("scheduled", "dense")
MAX_HEAD_SIZE_SCHEDULED = 512
_DTYPES = ("float32", "bfloat16", "float16")


def paged_attention(query: Any, key: Any, value: Any, kv_cache: Any, block_tables: Any,
                    query_lens: Any, context_lens: Any, *, softmax_scale: float | None = None,
                    mixed_precision: bool = True, large_tile_size: int = 2048,
                    backend: str = "auto", gqa_packing: Any = "auto",
                    kernel: str = "scheduled", sliding_window: int | None = None,
                    logits_soft_cap: float | None = None, alibi_slopes: Any = None,
                    sinks: Any = None, k_scale: Any = None, v_scale: Any = None,
                    partial_tile_size: Any = "auto", api: str | None = None,
                    lnc: int | None = None) -> Any:
    """Paged attention of a flat batch of new tokens against their cached context and themselves.

    Same arguments and result shape as ``host.reference.paged_attention_ref``.

    Args:
        query: (T, H, d) float32/bfloat16/float16; sequences contiguous and in order.
        key, value: (T, Hkv, d), the new tokens' K/V, same dtype as query.
        kv_cache: (2, N, Hkv, B, d), same dtype, or an fp8 cache (float8_e4m3fn / float8_e5m2,
            scheduled kernel, with k_scale / v_scale); [0] = K, [1] = V (not modified).
        block_tables: (S, max_blocks) integer; row i's first ceil(context_lens[i] / B) entries
            are sequence i's context blocks (ids in [0, N)); later entries are ignored.
        query_lens: (S,) integers >= 1 summing to T.  context_lens: (S,) integers >= 0.
        softmax_scale: default 1/sqrt(d).
        mixed_precision: bf16 matmuls with fp32 statistics (True) or the input dtype (False).
        large_tile_size: context tokens per KV tile, a power of two in [512, 8192].
        partial_tile_size: scheduled kernel: keys per tile of the masked (partial) items, a power
            of two in [512, large_tile_size], or "auto" (the host picks one per batch,
            docs/layouts.md §16.3). Fix it to bound the kernel shapes a serving engine compiles.
        backend: "auto" | "sim" | "neuron" (module docstring).
        api: scheduled kernel: the NKI API it runs on, "legacy" (``neuronxcc.nki``, trn1) or
            "nki" (the current API, trn2 / trn3); None / "auto": ``NKI_PA_API`` or the automatic
            choice of ``nki_kernels._nki.resolve_api``. The dense kernel is legacy-only.
        lnc: scheduled kernel: physical cores per launch, 1 or 2 (trn2 / trn3: the KV heads
            split between the two cores of a logical core); None: ``NEURON_LOGICAL_NC_CONFIG``,
            else the platform's (2 on trn2 where the API can split the launch, 1 on trn1;
            ``nki_kernels._nki.Api.lnc``).
        kernel: "scheduled" (default) runs ``nki_kernels.scheduled_attention`` through a host
            schedule (``host.schedule``): only (query block, KV tile) pairs of the same sequence,
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
            heads packed as extra query rows (``host.gqa_packing``, docs/layouts.md §11): fewer
            Q-tile passes for decode-heavy batches. "auto" packs when
            ``host.gqa_packing.choose_gqa_packing`` says it does less work (never when G == 1,
            where packing is a no-op).

    Returns:
        (T, H, d) in query's dtype; a torch tensor if ``query`` was one. Inputs are never modified.

    Raises:
        ValueError: bad shapes, dtypes, lengths, block ids or options (names the argument).
        RuntimeError: backend="neuron" without the real Neuron toolchain.

    Pseudocode:
        plan = make_plan(query_lens, context_lens, B, large_tile_size)    # validation
        scheduled: sched = make_schedule(...); overlay = build_overlay(...)
                   for each class (decode / prefill): launch scheduled_paged_attention[1, Hkv]
                   on pack_queries(...); unpack_output(...)          (host/scheduled.py)
        dense:
        bt = active_block_table(plan, block_tables); mask = build_attention_mask(plan)
        Q/K/V -> zero-padded to Qpad tokens and transposed to the kernel layouts
        out = flash_paged_attention[1, Hkv](Q, K, V, kv_cache, bt, mask, ...)   (1, H, Qpad, d)
        return out[0, :, :T].transpose(1, 0, 2)
        (packed: the same with query'/key'/value' = pack_query/pack_kv, plan of query_lens * G,
         mask = packed_attention_mask, H' = Hkv, then unpack_output)
    """
    q_np, was_torch = to_numpy(query, "query")
    q = check_float_array("query", q_np, ndim=3)
    k = check_float_array("key", key, ndim=3)
    v = check_float_array("value", value, ndim=3)
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
    _, N, Hkv, B, _ = cache.shape
    check_shape("key", k, (T, Hkv, d), "(T, Hkv, d) matching query and kv_cache")
    check_shape("value", v, (T, Hkv, d), "(T, Hkv, d) matching query and kv_cache")
    if not isinstance(kernel, str) or kernel not in KERNELS:
        fail("kernel", f"be one of {KERNELS}", repr(kernel))
    _check_common(H, Hkv, d, N, mixed_precision, backend,
                  max_head_size=MAX_HEAD_SIZE_SCHEDULED if kernel == "scheduled" else 128)
    scale = _check_scale(softmax_scale, d)
    if kernel == "scheduled" and gqa_packing is False:
        raise NotImplementedError("paged_attention: the scheduled kernel always packs the G query "
                                  "heads of a KV head as query rows; gqa_packing=False applies to "
                                  "kernel='dense' only")
    variants = make_variants(H, Hkv, cache.dtype, sliding_window=sliding_window,
                             logits_soft_cap=logits_soft_cap, alibi_slopes=alibi_slopes,
                             sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    if kernel == "dense" and not variants.is_default:
        raise NotImplementedError(
            "paged_attention: attention variants (sliding_window, logits_soft_cap, alibi_slopes, "
            "sinks, fp8 caches with k_scale / v_scale) are not supported by the dense kernel; use "
            "kernel='scheduled'")
    if not (isinstance(gqa_packing, (bool, np.bool_))
            or (isinstance(gqa_packing, str) and gqa_packing == "auto")):
        fail("gqa_packing", "be 'auto', True or False", repr(gqa_packing))

    plan = make_plan(query_lens, context_lens, block_size=B, large_tile_size=large_tile_size)
    if not (isinstance(partial_tile_size, str) and partial_tile_size == "auto"):
        check_power_of_two("partial_tile_size", partial_tile_size, lo=512, hi=large_tile_size)
        if kernel == "dense":
            raise NotImplementedError("paged_attention: partial_tile_size applies to the scheduled "
                                      "kernel; leave it 'auto' with kernel='dense'")
    if plan.num_queries != T:
        fail("query_lens", f"sum to query.shape[0] = {T}", f"sum {plan.num_queries}")
    bt_np, _ = to_numpy(block_tables, "block_tables")
    active = active_block_table(plan, bt_np, num_blocks=N)
    if kernel == "scheduled":
        from nki_kernels import _nki

        _nki.resolve_api(api).lnc(lnc, Hkv)        # a bad api / lnc / combination fails before work
        bt_checked = check_integer_array("block_tables", bt_np, ndim=2)
        out = run_scheduled(q, k, v, kernel_cache_view(np.ascontiguousarray(cache)), bt_checked,
                            plan.query_lens, plan.context_lens, scale=scale,
                            mixed_precision=bool(mixed_precision), large_tile_size=large_tile_size,
                            launch=lambda kern, args, kw, hkv: _run(kern, args, kw, hkv, backend, api,
                                                                     lnc),
                            variants=None if variants.is_default else variants,
                            partial_tile_size=partial_tile_size)
        return from_numpy_like(out, was_torch, like=query)
    G = H // Hkv
    if gqa_packing == "auto":
        gqa_packing = choose_gqa_packing(plan.query_lens, H, Hkv, context_lens=plan.context_lens,
                                         large_tile_size=large_tile_size)
    if gqa_packing and G > 1:
        plan = make_plan(plan.query_lens * G, plan.context_lens, block_size=B,
                         large_tile_size=large_tile_size)
        q, k, v = pack_query(q, Hkv), pack_kv(k, G), pack_kv(v, G)
        mask = packed_attention_mask(plan, G)
    else:
        mask = build_attention_mask(plan)

    T, Hq = q.shape[0], q.shape[1]
    Qpad = plan.padded_queries
    q_in = np.zeros((1, Hq, d, Qpad), dtype=q.dtype)
    q_in[0, :, :, :T] = q.transpose(1, 2, 0)
    k_in = np.zeros((1, Hkv, d, Qpad), dtype=q.dtype)
    k_in[0, :, :, :T] = k.transpose(1, 2, 0)
    v_in = np.zeros((1, Hkv, Qpad, d), dtype=q.dtype)
    v_in[0, :, :T, :] = v.transpose(1, 0, 2)
    out = _launch(q_in, k_in, v_in, np.ascontiguousarray(cache), active, mask, scale,
                  bool(mixed_precision), large_tile_size, Hkv, backend)
    result = np.ascontiguousarray(np.asarray(out)[0, :, :T, :].transpose(1, 0, 2))
    if Hq != H:
        result = unpack_output(result, H)
    return from_numpy_like(result, was_torch, like=query)


def flash_attn_varlen_nkifunc(query: Any, key: Any, value: Any, kv_cache: Any, block_table: Any,
                              attn_mask: Any, n_kv_head: int | None = None,
                              head_size: int | None = None, LARGE_TILE_SZ: int = 2048,
                              mixed_precision: bool = True, *, backend: str = "auto") -> Any:
    """vLLM's wrapper (``vllm/attention/ops/nki_flash_attn.py``, fused-cache form): kernel layouts.

    Args:
        query: (1, H, d, Qpad); key: (1, Hkv, d, Qpad); value: (1, Hkv, Qpad, d); Qpad a
            multiple of 128 (vLLM pads to its compile buckets), same float dtype throughout.
        kv_cache: (2, N, Hkv, B, d).
        block_table: (num_active_blocks,) integer ids (converted to int32), a multiple of
            LARGE_TILE_SZ // B entries (zero allowed: no context).
        attn_mask: (Qpad, num_active_blocks*B + Qpad) bool, or integer 0/1 (vLLM documents int32),
            context part already reordered (``host.masks.reorder_context_mask``).
        n_kv_head, head_size: optional; must match kv_cache.shape[2] / kv_cache.shape[4].
        LARGE_TILE_SZ, mixed_precision: as the kernel. softmax_scale is 1/sqrt(head_size).
        backend: as :func:`paged_attention` (keyword-only extension).

    Returns:
        (1, H, Qpad, d) in query's dtype -- the kernel output, NOT unpadded or transposed (as in
        vLLM, the caller permutes it to (Qpad, H, d) and slices the real tokens). torch in,
        torch out (decided by ``query``).

    Raises:
        ValueError / NotImplementedError: from the checks here and in the kernel.
    """
    q_np, was_torch = to_numpy(query, "query")
    q = check_float_array("query", q_np, ndim=4)
    k = check_float_array("key", key, ndim=4)
    v = check_float_array("value", value, ndim=4)
    cache = check_float_array("kv_cache", kv_cache, ndim=5)
    _check_dtype("query", q)
    if cache.shape[0] != 2:
        fail("kv_cache", "have shape (2, num_blocks, Hkv, block_size, d)", f"shape {cache.shape}")
    _, N, Hkv, B, d = cache.shape
    if n_kv_head is not None and n_kv_head != Hkv:
        fail("n_kv_head", f"equal kv_cache.shape[2] = {Hkv}", repr(n_kv_head))
    if head_size is not None and head_size != d:
        fail("head_size", f"equal kv_cache.shape[4] = {d}", repr(head_size))
    _check_common(q.shape[1], Hkv, d, N, mixed_precision, backend)
    bt = check_integer_array("block_table", block_table, ndim=1)
    if bt.size and (bt.min() < 0 or bt.max() >= N):
        bad = int(np.argmax((bt < 0) | (bt >= N)))
        fail("block_table", f"hold block ids in [0, {N})", f"block_table[{bad}] = {int(bt[bad])}")
    m_np, _ = to_numpy(attn_mask, "attn_mask")
    if m_np.dtype != np.bool_:
        if m_np.dtype.kind not in "iu":
            fail("attn_mask", "be bool or integer 0/1", f"dtype {m_np.dtype}")
        if m_np.size and not np.isin(m_np, (0, 1)).all():
            fail("attn_mask", "hold only 0 and 1 when integer", "other values")
        m_np = m_np.astype(bool)
    out = _launch(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                  np.ascontiguousarray(cache), bt.astype(np.int32), np.ascontiguousarray(m_np),
                  1.0 / math.sqrt(d), bool(mixed_precision), LARGE_TILE_SZ, Hkv, backend)
    return from_numpy_like(np.asarray(out), was_torch, like=query)


def _check_dtype(name: str, arr: np.ndarray) -> None:
    if arr.dtype.name not in _DTYPES:
        fail(f"{name}.dtype", f"be one of {_DTYPES}", arr.dtype.name)


def _check_common(H: int, Hkv: int, d: int, N: int, mixed_precision: Any, backend: Any, *,
                  max_head_size: int = 128) -> None:
    if Hkv < 1 or N < 1:
        fail("kv_cache", "have num_blocks >= 1 and Hkv >= 1", f"N={N}, Hkv={Hkv}")
    if H % Hkv:
        fail("query", f"have a head count divisible by num_kv_heads={Hkv}", f"H = {H}")
    if not 1 <= d <= max_head_size:
        what = ("the dense kernel keeps one SBUF partition per channel" if max_head_size == 128
                else "the scheduled kernel accumulates QK^T over 128-channel slices")
        fail("head size d", f"be in [1, {max_head_size}] ({what})", d)
    if not isinstance(mixed_precision, (bool, np.bool_)):
        fail("mixed_precision", "be a bool", repr(mixed_precision))
    if backend not in BACKENDS:
        fail("backend", f"be one of {BACKENDS}", repr(backend))


def _check_scale(softmax_scale: Any, d: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(softmax_scale)):
        fail("softmax_scale", "be a finite real number or None", repr(softmax_scale))
    return float(softmax_scale)


def _launch(q, k, v, kv_cache, block_table, mask, scale, mixed_precision, large_tile, Hkv, backend):
    """Run the dense kernel on grid [1, Hkv]; returns the (1, H, Qpad, d) output as NumPy."""
    from nki_kernels.flash_paged_attention import flash_paged_attention

    kwargs = dict(softmax_scale=scale, mixed_precision=mixed_precision, LARGE_TILE_SZ=large_tile)
    return _run(flash_paged_attention, (q, k, v, kv_cache, block_table, mask), kwargs, Hkv, backend)


def _run(kernel, args, kwargs, Hkv, backend, api=None, lnc=None):
    """Run ``kernel`` over Hkv KV heads on the chosen backend; returns its output as NumPy.
    Kernels of both APIs (``nki_kernels.ops.KernelFamily``) run on ``resolve_api(api)``;
    legacy-only kernels on grid [1, Hkv]."""
    from nki_kernels import _nki
    from nki_kernels.ops import KernelFamily

    if isinstance(kernel, KernelFamily):
        chosen = _nki.resolve_api(api)
        device = backend == "neuron" or (backend == "auto" and not chosen.simulated)
        if chosen.simulated and chosen.name == _nki.CURRENT:
            # nki.simulate writes its array arguments back: hand it writable ones
            args = tuple(np.array(a) if isinstance(a, np.ndarray) and not a.flags.writeable
                         else a for a in args)
        return np.asarray(chosen.launch(kernel, args, kwargs, num_kv_heads=Hkv, device=device,
                                        lnc=lnc))

    on_device = backend == "neuron" or (backend == "auto" and not _nki.SIMULATED)
    if on_device:
        if _nki.SIMULATED:
            raise RuntimeError("backend='neuron' needs the real Neuron toolchain (neuronx-cc) and a "
                               "Trainium device, but nki_sim is active (NKI_PA_BACKEND="
                               f"{_nki.BACKEND_REQUEST!r}); use backend='sim' or 'auto'")
        return np.asarray(kernel[1, Hkv](*args, **kwargs))
    return np.asarray(_nki.nki.simulate_kernel(kernel[1, Hkv], *args, **kwargs))
