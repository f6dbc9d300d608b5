"""torch custom ops: ``torch.ops.nki_pa.paged_attention``, ``.reshape_and_cache``, ``.copy_blocks``.

Registered with ``torch.library.custom_op`` (schemas below), each with a fake (meta)
implementation, so the ops work under ``torch.compile`` and fake-tensor tracing; the real computation is opaque to the compiler (one graph node per call).

Implementations, chosen by the device of the tensors (torch dispatch, never by guessing):

* CPU tensors: the host functions (``host.run_paged_attention`` with the step's plan,
  ``host.reshape_and_cache``, ``host.copy_blocks``), which run the kernels on ``nki_sim`` here,
  or on a Trainium device when the real toolchain is installed (``backend="auto"``). The layers
  of a step share one plan: ``host.plan_cache`` keys plans by the content of the block tables
  and lengths, so the first layer plans and the others reuse it.
* XLA (Neuron) tensors: ``host.serving.torch_neuron`` launches the ``@nki.jit`` kernels on the XLA
  tensors (torch-neuronx's NKI integration). It runs only when torch-neuronx and torch-xla are
  importable and the API the launches resolve to (``nki_kernels.toolchain.resolve_api``) is a
  real NKI package (``nki`` on SDK 2.34, ``neuronxcc.nki`` on SDK <= 2.28); otherwise the call
  raises ``NotImplementedError`` naming what is missing -- it never falls back to the CPU. The kernel is the one the CPU path runs.
* Tensors on different devices (e.g. a CPU query with a ``meta`` cache) raise ``ValueError``
  naming the tensor: a meta tensor has no data (all-meta calls trace shapes only).

torch is an optional extra: importing this module without torch raises ImportError; nothing
else in ``host`` imports it.

Schemas (T tokens, S sequences, H / Hkv heads, d head size, N blocks, B block size, L layers):

    paged_attention(query (T,H,d), key (T,Hkv,d), value (T,Hkv,d), kv_cache (2,N,Hkv,B,d),
                    block_tables (S,max_blocks) int, query_lens (S,) int, context_lens (S,) int,
                    softmax_scale=None, mixed_precision=True, large_tile_size=None (= "auto"),
                    gqa_packing=None (= "auto"), attention_kernel=None, sliding_window=None,
                    logits_soft_cap=None, alibi_slopes=None (H,), sinks=None (H,),
                    k_scale=None, v_scale=None (tensors: () per tensor or (Hkv,) per KV head),
                    api=None ("legacy" | "nki": the NKI API of the launch),
                    value_cache=None (vLLM's block-KV layout: kv_cache is then the key cache
                    (N,B,Hkv,d) and value_cache the value cache (N,B,Hkv,d), read in place))
                    -> (T,H,d)                                     [pure]
    reshape_and_cache(key (T,Hkv,d), value (T,Hkv,d), kv_cache (2,N,Hkv,B,d), slot_mapping (T,),
                      k_scale=None, v_scale=None, value_cache=None (vLLM's block-KV layout:
                      kv_cache is then the key cache (N,B,Hkv,d), value_cache the value cache))
                                                                     [mutates kv_cache, value_cache]
    copy_blocks(kv_caches (L,2,N,Hkv,B,d) or (2,N,Hkv,B,d), block_mapping (n,2) int)
                                                                     [mutates kv_caches]

The keyword options ``attention_kernel`` (host ``kernel=``; the name ``kernel`` is taken inside
torch.compile's lowering) .. ``v_scale`` are handed to ``host.paged_attention`` only when set; a
set option the installed host function does not accept raises NotImplementedError.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

try:
    import torch
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("host.serving.torch_ops needs torch: pip install -e '.[torch]'") from e

from torch import Tensor

from host.serving import torch_neuron
from host.step_plan import LAYER_VALUES

__all__ = ["NAMESPACE", "paged_attention", "reshape_and_cache", "copy_blocks", "host_options",
           "VARIANT_OPTIONS", "step_plan", "check_devices"]

NAMESPACE = "nki_pa"
VARIANT_OPTIONS = ("kernel", "sliding_window", "logits_soft_cap", "alibi_slopes", "sinks",
                   "k_scale", "v_scale")


def host_options(**options: Any) -> dict[str, Any]:
    """The set (non-None) variant options, checked against ``host.paged_attention``'s signature.

    Raises:
        NotImplementedError: an option is set that the installed ``host.paged_attention`` does
            not take (no silent dropping).
    """
    from host.attention import paged_attention as host_fn

    params = inspect.signature(host_fn).parameters
    chosen = {k: v for k, v in options.items() if v is not None}
    missing = sorted(k for k in chosen if k not in params)
    if missing:
        raise NotImplementedError(f"host.paged_attention does not support {missing} in this "
                                  "version; leave them unset (None) or update nki-paged-attention")
    return chosen


@torch.library.custom_op(f"{NAMESPACE}::paged_attention", mutates_args=(), device_types="cpu")
def paged_attention(query: Tensor, key: Tensor, value: Tensor, kv_cache: Tensor,
                    block_tables: Tensor, query_lens: Tensor, context_lens: Tensor,
                    softmax_scale: Optional[float] = None, mixed_precision: bool = True,
                    large_tile_size: Optional[int] = None, gqa_packing: Optional[bool] = None,
                    attention_kernel: Optional[str] = None, sliding_window: Optional[int] = None,
                    logits_soft_cap: Optional[float] = None, alibi_slopes: Optional[Tensor] = None,
                    sinks: Optional[Tensor] = None, k_scale: Optional[Tensor] = None,
                    v_scale: Optional[Tensor] = None, api: Optional[str] = None,
                    value_cache: Optional[Tensor] = None) -> Tensor:
    """CPU: ``host.run_paged_attention`` with the step's plan (``host.plan_cache``: the layers
    of a step share one plan); module docstring for shapes. Returns a new (T, H, d) tensor.
    With ``value_cache`` the cache is the block-KV pair ``(kv_cache, value_cache)``."""
    from host.attention import run_paged_attention

    check_devices("paged_attention", query=query, key=key, value=value, kv_cache=kv_cache,
                  block_tables=block_tables, query_lens=query_lens, context_lens=context_lens,
                  alibi_slopes=alibi_slopes, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
                  value_cache=value_cache)
    if value_cache is not None:
        kv_cache = (kv_cache, value_cache)
    extra = host_options(kernel=attention_kernel, sliding_window=sliding_window,
                         logits_soft_cap=logits_soft_cap, alibi_slopes=alibi_slopes, sinks=sinks,
                         k_scale=k_scale, v_scale=v_scale)
    layer = {k: extra.pop(k) for k in LAYER_VALUES if k in extra}
    plan = step_plan(query, key, value, kv_cache, block_tables, query_lens, context_lens,
                     softmax_scale=softmax_scale, mixed_precision=mixed_precision,
                     large_tile_size="auto" if large_tile_size is None else large_tile_size,
                     gqa_packing="auto" if gqa_packing is None else gqa_packing, api=api, **extra,
                     **layer)
    return run_paged_attention(plan, query, key, value, kv_cache, **layer)


def step_plan(query, key, value, kv_cache, block_tables, query_lens, context_lens, **options):
    """The plan of this call's batch, shared with the other layers of the step
    (``host.plan_cache.cached_plan``): geometry from the tensors, ``options`` as
    ``host.paged_attention``'s. Tensor checks happen here, before planning, with the messages
    of ``host.paged_attention``."""
    from host.attention import check_attention_tensors
    from host.cache.block_kv import is_block_kv, kv_dims
    from host.plan_cache import cached_plan
    from nki_kernels.contract import BLOCK_KV, FUSED

    from host.validation import check_query_total

    q, _, _, cache = check_attention_tensors(query, key, value, kv_cache)
    T, H, d = q.shape
    check_query_total(query_lens, T)
    N, B, Hkv, _ = kv_dims(cache)
    block_kv = is_block_kv(cache)
    plan = cached_plan(block_tables, query_lens, context_lens, num_heads=H, num_kv_heads=Hkv,
                       head_size=d, block_size=B, num_blocks=N, dtype=q.dtype,
                       kv_cache_dtype=(cache[0] if block_kv else cache).dtype,
                       kv_layout=BLOCK_KV if block_kv else FUSED, **options)
    if plan.num_tokens != T:
        from host.validation import fail

        fail("query_lens", f"sum to query.shape[0] = {T}", f"sum {plan.num_tokens}")
    return plan


def check_devices(op: str, **tensors: Any) -> None:
    """Every given tensor on one device, and none on ``meta`` unless all are (shape tracing):
    a ValueError naming the first tensor on another device."""
    given = [(n, t) for n, t in tensors.items() if isinstance(t, Tensor)]
    if not given:
        return
    first_name, first = given[0]
    for name, t in given[1:]:
        if t.device != first.device:
            if "meta" in (t.device.type, first.device.type):
                hint = " (a meta tensor has no data to read or write)"
            else:
                hint = ""
            raise ValueError(f"nki_pa::{op}: {name} must be on the device of {first_name} "
                             f"({first.device}){hint}; got {t.device}")


@paged_attention.register_fake
def _paged_attention_fake(query, key, value, kv_cache, block_tables, query_lens, context_lens,
                          softmax_scale=None, mixed_precision=True, large_tile_size=None,
                          gqa_packing=None, attention_kernel=None, sliding_window=None,
                          logits_soft_cap=None, alibi_slopes=None, sinks=None, k_scale=None,
                          v_scale=None, api=None, value_cache=None):
    check_devices("paged_attention", query=query, key=key, value=value, kv_cache=kv_cache,
                  block_tables=block_tables, query_lens=query_lens, context_lens=context_lens,
                  alibi_slopes=alibi_slopes, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
                  value_cache=value_cache)
    torch._check(query.dim() == 3, lambda: f"query must be (T, H, d); got {tuple(query.shape)}")
    return query.new_empty(query.shape)


@torch.library.custom_op(f"{NAMESPACE}::reshape_and_cache",
                         mutates_args=("kv_cache", "value_cache"), device_types="cpu")
def reshape_and_cache(key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor,
                      k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None,
                      value_cache: Optional[Tensor] = None) -> None:
    """CPU: ``host.reshape_and_cache`` -- writes key/value rows into ``kv_cache`` in place
    (an fp8 cache quantizes with ``k_scale`` / ``v_scale``); with ``value_cache`` into vLLM's
    block-KV pair, ``kv_cache`` the key cache and ``value_cache`` the value cache."""
    from host.cache.cache_ops import reshape_and_cache as host_fn

    check_devices("reshape_and_cache", key=key, value=value, kv_cache=kv_cache,
                  slot_mapping=slot_mapping, k_scale=k_scale, v_scale=v_scale,
                  value_cache=value_cache)
    scales = {k: v for k, v in (("k_scale", k_scale), ("v_scale", v_scale)) if v is not None}
    host_fn(key, value, kv_cache if value_cache is None else (kv_cache, value_cache),
            slot_mapping, **scales)


@reshape_and_cache.register_fake
def _reshape_and_cache_fake(key, value, kv_cache, slot_mapping, k_scale=None, v_scale=None,
                            value_cache=None):
    check_devices("reshape_and_cache", key=key, value=value, kv_cache=kv_cache,
                  slot_mapping=slot_mapping, k_scale=k_scale, v_scale=v_scale,
                  value_cache=value_cache)
    return None


@torch.library.custom_op(f"{NAMESPACE}::copy_blocks", mutates_args=("kv_caches",),
                         device_types="cpu")
def copy_blocks(kv_caches: Tensor, block_mapping: Tensor) -> None:
    """CPU: ``host.copy_blocks`` on every layer of ``kv_caches`` (6-D) or on one layer (5-D)."""
    from host.cache.cache_ops import copy_blocks as host_fn

    check_devices("copy_blocks", kv_caches=kv_caches, block_mapping=block_mapping)
    if kv_caches.dim() not in (5, 6):
        from host.validation import fail

        fail("kv_caches", "be (L, 2, N, ...) or one layer's (2, N, ...) cache (6-D or 5-D; a "
             "block-KV key or value cache alone is 4-D: pass vLLM's (2, N, B, Hkv, d) layer "
             "tensor)", f"{kv_caches.dim()}-D shape {tuple(kv_caches.shape)}")
    host_fn([kv_caches] if kv_caches.dim() == 5 else kv_caches, block_mapping)


@copy_blocks.register_fake
def _copy_blocks_fake(kv_caches, block_mapping):
    check_devices("copy_blocks", kv_caches=kv_caches, block_mapping=block_mapping)
    return None


torch_neuron.register_device_kernels(paged_attention, reshape_and_cache, copy_blocks)
