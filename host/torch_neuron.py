"""Device path of the ``nki_pa`` torch ops: the ``@nki.jit`` kernels on XLA (Neuron) tensors.

With the legacy NKI API (Neuron SDK 2.21-2.27) the documented way to call a kernel from PyTorch
is to call the ``@nki.jit`` function with ``torch_xla`` tensors on the Neuron device: torch-neuronx
detects the framework from the arguments and inserts the kernel into the XLA graph as a custom
call (``torch_neuronx.nki_jit`` was the older spelling, removed in 2.24). This is what
:func:`launch` does, with the kernels of ``nki_kernels`` and the same host-built inputs as
``host.paged_attention`` (docs/layouts.md §2-§8), so vLLM's calling convention is kept.

Selection: ``host.torch_ops`` registers the functions here as the ops' XLA kernels. Each call
first checks :func:`toolchain_status`: torch-neuronx and torch-xla importable AND
``nki_kernels._nki`` resolved to the real ``neuronxcc.nki``. If not, ``NotImplementedError``
says what is missing; the call is never routed to the CPU or the simulator behind the caller's
back. CPU tensors never reach this module.

Not verified on hardware (no device or neuronx-cc was available): the torch-side input
preparation is tested on CPU with :func:`launch` replaced by a simulator launch
(tests/integration/test_torch_ops.py); the torch-xla custom-call lowering itself is not.
Limits of this path: the dense flash kernel only (no ``attention_kernel`` / variants, no GQA
query packing); lengths, block tables and slot mappings are read on the host (a device sync).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from host.attention import _check_common, _check_scale
from host.block_tables import active_block_table
from host.cache_ops import (block_copy_row_pairs, block_row_len, cache_write_row_index,
                            check_block_mapping)
from host.masks import build_attention_mask
from host.plan import make_plan
from host.validation import check_slot_mapping, fail

__all__ = ["toolchain_status", "require_toolchain", "launch", "register_device_kernels",
           "device_paged_attention", "device_reshape_and_cache", "device_copy_blocks"]

REQUIRED_MODULES = ("torch_neuronx", "torch_xla")
_find_spec = importlib.util.find_spec  # module attribute so tests can stand in for installs


def toolchain_status() -> tuple[bool, str]:
    """``(available, reason)``: can the ops run their kernels on a Neuron device here?"""
    missing = [m for m in REQUIRED_MODULES if _find_spec(m) is None]
    if missing:
        return False, f"{', '.join(missing)} not importable"
    from nki_kernels import _nki

    if _nki.SIMULATED:
        return False, ("neuronxcc.nki is the nki_sim simulator (neuronx-cc not installed, or "
                       f"NKI_PA_BACKEND={_nki.BACKEND_REQUEST!r})")
    return True, "torch-neuronx, torch-xla and neuronxcc.nki are importable"


def require_toolchain(op: str) -> None:
    """Raise ``NotImplementedError`` unless :func:`toolchain_status` says available."""
    ok, why = toolchain_status()
    if not ok:
        raise NotImplementedError(
            f"nki_pa::{op} on an XLA device needs the Neuron toolchain (torch-neuronx, torch-xla, "
            f"neuronx-cc; README 'Running on Trainium'): {why}. Move the tensors to the CPU to run "
            "the kernels through the host API instead.")


def launch(kernel: Any, grid: tuple[int, ...] | None, *args: Any, **kwargs: Any) -> Any:
    """Call an ``@nki.jit`` kernel on torch tensors (torch-neuronx lowers it into the XLA graph)."""
    return (kernel[grid] if grid else kernel)(*args, **kwargs)


def register_device_kernels(paged_attention_op: Any, reshape_and_cache_op: Any,
                            copy_blocks_op: Any) -> None:
    """Register the XLA kernels of the three ``nki_pa`` ops (called by ``host.torch_ops``)."""
    paged_attention_op.register_kernel("xla")(_paged_attention_xla)
    reshape_and_cache_op.register_kernel("xla")(_reshape_and_cache_xla)
    copy_blocks_op.register_kernel("xla")(_copy_blocks_xla)


def _paged_attention_xla(query, key, value, kv_cache, block_tables, query_lens, context_lens,
                         softmax_scale=None, mixed_precision=True, large_tile_size=2048,
                         gqa_packing=None, attention_kernel=None, sliding_window=None,
                         logits_soft_cap=None, alibi_slopes=None, sinks=None, k_scale=None,
                         v_scale=None):
    require_toolchain("paged_attention")
    variants = dict(sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                    alibi_slopes=alibi_slopes, sinks=sinks, k_scale=k_scale, v_scale=v_scale,
                    attention_kernel=None if attention_kernel == "dense" else attention_kernel)
    unsupported = sorted(k for k, v in variants.items() if v is not None)
    unsupported += ["gqa_packing=True"] if gqa_packing else []
    if unsupported:
        raise NotImplementedError(f"the XLA device path runs the dense flash kernel only; "
                                  f"{unsupported} need CPU tensors (the host API)")
    return device_paged_attention(query, key, value, kv_cache, block_tables, query_lens,
                                  context_lens, softmax_scale=softmax_scale,
                                  mixed_precision=mixed_precision, large_tile_size=large_tile_size)


def _reshape_and_cache_xla(key, value, kv_cache, slot_mapping, k_scale=None, v_scale=None):
    require_toolchain("reshape_and_cache")
    if k_scale is not None or v_scale is not None:
        raise NotImplementedError("the XLA device path writes float32 / bfloat16 / float16 caches "
                                  "only; fp8 caches (k_scale / v_scale) need CPU tensors")
    device_reshape_and_cache(key, value, kv_cache, slot_mapping)


def _copy_blocks_xla(kv_caches, block_mapping):
    require_toolchain("copy_blocks")
    device_copy_blocks(kv_caches, block_mapping)


def device_paged_attention(query, key, value, kv_cache, block_tables, query_lens, context_lens, *,
                           softmax_scale=None, mixed_precision=True, large_tile_size=2048):
    """:func:`host.paged_attention` with torch tensors kept on their device (no GQA packing).

    Shapes as ``host.paged_attention``. Host work: plan, active block table and mask from the
    (small) length / block-table tensors; Q/K/V padding and transposes are torch ops on the
    tensors' device. Returns (T, H, d) on query's device.
    """
    import torch

    if query.dim() != 3 or kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        fail("query / kv_cache", "be (T, H, d) / (2, num_blocks, Hkv, block_size, d)",
             f"shapes {tuple(query.shape)} / {tuple(kv_cache.shape)}")
    T, H, d = query.shape
    _, N, Hkv, B, _ = kv_cache.shape
    for name, t in (("key", key), ("value", value)):
        if tuple(t.shape) != (T, Hkv, d) or t.dtype != query.dtype:
            fail(name, f"be (T, Hkv, d) = {(T, Hkv, d)} in {query.dtype}",
                 f"{tuple(t.shape)} {t.dtype}")
    if kv_cache.dtype != query.dtype:
        fail("kv_cache.dtype", f"equal query.dtype ({query.dtype})", str(kv_cache.dtype))
    _check_common(H, Hkv, d, N, mixed_precision, "neuron")
    scale = _check_scale(softmax_scale, d)
    plan = make_plan(_host(query_lens), _host(context_lens), block_size=B,
                     large_tile_size=large_tile_size)
    if plan.num_queries != T:
        fail("query_lens", f"sum to query.shape[0] = {T}", f"sum {plan.num_queries}")
    dev, Qpad = query.device, plan.padded_queries
    active = torch.from_numpy(active_block_table(plan, _host(block_tables), num_blocks=N)).to(dev)
    mask = torch.from_numpy(build_attention_mask(plan)).to(dev)
    q_in = query.new_zeros((1, H, d, Qpad))
    q_in[0, :, :, :T] = query.permute(1, 2, 0)
    k_in = query.new_zeros((1, Hkv, d, Qpad))
    k_in[0, :, :, :T] = key.permute(1, 2, 0)
    v_in = query.new_zeros((1, Hkv, Qpad, d))
    v_in[0, :, :T, :] = value.permute(1, 0, 2)
    from nki_kernels.flash_paged_attention import flash_paged_attention

    out = launch(flash_paged_attention, (1, Hkv), q_in, k_in, v_in, kv_cache, active, mask,
                 softmax_scale=scale, mixed_precision=bool(mixed_precision),
                 LARGE_TILE_SZ=large_tile_size)
    return out[0, :, :T, :].permute(1, 0, 2).contiguous()


def device_reshape_and_cache(key, value, kv_cache, slot_mapping) -> None:
    """:func:`host.reshape_and_cache` with torch tensors kept on their device (in place)."""
    import torch

    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        fail("kv_cache", "have shape (2, num_blocks, Hkv, block_size, d)", f"shape {tuple(kv_cache.shape)}")
    _, N, Hkv, B, d = kv_cache.shape
    if key.dim() != 3 or tuple(key.shape[1:]) != (Hkv, d) or value.shape != key.shape:
        fail("key / value", f"be (T, {Hkv}, {d}) to match kv_cache",
             f"{tuple(key.shape)} / {tuple(value.shape)}")
    slots = check_slot_mapping(_host(slot_mapping), num_tokens=key.shape[0], num_slots=N * B,
                               tokens_arg="key")
    if not (slots >= 0).any():
        return
    rows = cache_write_row_index(slots, num_blocks=N, num_kv_heads=Hkv, block_size=B)
    from nki_kernels.kv_cache_update import kv_cache_update

    out = launch(kv_cache_update.for_api("legacy"), None, key.to(kv_cache.dtype).contiguous(),
                 value.to(kv_cache.dtype).contiguous(), kv_cache,
                 torch.from_numpy(rows).to(kv_cache.device))
    _write_back(kv_cache, out)


def device_copy_blocks(kv_caches, block_mapping) -> None:
    """:func:`host.copy_blocks` on a (L, 2, N, Hkv, B, d) or (2, N, Hkv, B, d) device tensor."""
    import torch

    whole = kv_caches.unsqueeze(0) if kv_caches.dim() == 5 else kv_caches
    if whole.dim() != 6 or whole.shape[1] != 2:
        fail("kv_caches", "be (L, 2, num_blocks, Hkv, block_size, d) or (2, num_blocks, Hkv, "
             "block_size, d)", f"shape {tuple(kv_caches.shape)}")
    L, _, N, Hkv, B, d = whole.shape
    src, dst = check_block_mapping(_host(block_mapping), N, N, same_cache=True)
    if src.size == 0:
        return
    slab = Hkv * B * d
    f = block_row_len(slab, whole.element_size())
    pairs = block_copy_row_pairs(src, dst, num_layers=L, src_num_blocks=N, dst_num_blocks=N,
                                 n_sub=slab // f)
    from nki_kernels.block_copy import copy_cache_blocks

    out = launch(copy_cache_blocks.for_api("legacy"), None, whole, torch.from_numpy(pairs).to(whole.device),
                 row_elems=f)
    _write_back(whole, out)


def _host(t: Any) -> np.ndarray:
    """A small index tensor as a host NumPy array (a device sync for XLA tensors)."""
    if hasattr(t, "detach"):
        return t.detach().cpu().numpy()
    return np.asarray(t)


def _write_back(dst: Any, out: Any) -> None:
    """Mutable-tensor kernels return the updated tensor; copy it into ``dst`` unless it is ``dst``."""
    if out is not None and out.data_ptr() != dst.data_ptr():
        dst.copy_(out)
