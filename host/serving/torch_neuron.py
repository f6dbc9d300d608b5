"""Device path of the ``nki_pa`` torch ops: the ``@nki.jit`` kernels on XLA (Neuron) tensors.

The documented way to call a kernel from PyTorch is to call the ``@nki.jit`` function with
torch tensors on the Neuron device: torch-neuronx detects the framework from the arguments and
inserts the kernel into the XLA graph as a custom call (legacy API, SDK 2.21-2.27:
``kernel[1, Hkv](...)`` on ``torch_xla`` tensors; ``torch_neuronx.nki_jit`` was the older
spelling, removed in 2.24). With the current ``nki`` API (trn2 / trn3, torch-neuronx or
TorchNeuron) a kernel is launched without an SPMD grid (``kernel[lnc]`` takes one number, the
logical NeuronCore count, which defaults to the environment's) and returns its outputs.
:func:`launch` does both; the API of a kernel with both is ``nki_kernels.toolchain.resolve_api``'s.

Kernel choice: the SAME as for CPU tensors. ``paged_attention`` runs the plan that
``host.plan_paged_attention`` makes for the batch (``attention_kernel`` as on the CPU: the
scheduled kernel by default, with its variants; "dense" for the vLLM-interface kernel), shared
by every layer of a step (``host.plan_cache``). Lengths and block tables are read on the host (a
device sync); the per-layer inputs are gathers on the tensors' device (``host.scheduled.scheduled_index``:
packed Q^T, the overlay rows from the cache -- fused, or vLLM's block-KV pair -- and the new K/V,
never a copy of the whole cache), and the output rows are scattered back on the device.

Selection: ``host.serving.torch_ops`` registers the functions here as the ops' XLA kernels. Each call
first checks :func:`toolchain_status`: torch-neuronx and torch-xla importable AND the API the
launches run on (``nki_kernels.toolchain.resolve_api``) a real NKI package; if not,
``NotImplementedError`` says what is missing, and the call is never routed to the CPU or the
simulator behind the caller's back. CPU tensors never reach this module. The cache ops launch
their kernels on that API too, at the compiler's LNC (the cores split the rows).

Not verified on hardware (no device or neuronx-cc was available): the torch-side input
preparation is tested on CPU with :func:`launch` replaced by a simulator launch
(tests/integration/test_torch_ops.py); the torch-xla custom-call lowering itself is not.
Limits of this path: no fp8 caches (k_scale / v_scale).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from host.cache.block_kv import block_kv_write_rows
from host.cache.cache_ops import (block_copy_row_pairs, block_row_len, cache_write_row_index,
                            check_block_mapping)
from host.plan_cache import cached_plan
from host.scheduled.scheduled import block_major, group_major, launch_args, pair_launch_args
from host.scheduled.scheduled_index import output_index, overlay_index, query_index
from host.step_plan import layer_launches
from host.validation import check_slot_mapping, fail
from nki_kernels.contract import BLOCK_KV, FUSED

__all__ = ["toolchain_status", "require_toolchain", "launch",
           "register_device_kernels", "device_paged_attention", "device_reshape_and_cache",
           "device_copy_blocks"]

REQUIRED_MODULES = ("torch_neuronx", "torch_xla")
_find_spec = importlib.util.find_spec  # module attribute so tests can stand in for installs


def toolchain_status(api: str | None = None) -> tuple[bool, str]:
    """``(available, reason)``: can the ops run their kernels on a Neuron device here? torch-neuronx
    and torch-xla importable, and the NKI API the launches run on
    (``nki_kernels.toolchain.resolve_api(api)``: the current ``nki`` on a trn2 / trn3 install of
    SDK 2.34, the legacy ``neuronxcc.nki`` on SDK <= 2.28) a real package, not nki_sim."""
    missing = [m for m in REQUIRED_MODULES if _find_spec(m) is None]
    if missing:
        return False, f"{', '.join(missing)} not importable"
    from nki_kernels import toolchain

    try:
        chosen = toolchain.resolve_api(api)
    except (RuntimeError, NotImplementedError) as err:
        return False, f"no NKI API to launch on ({err})"
    pkg = "neuronxcc.nki" if chosen.name == toolchain.LEGACY else "nki"
    if chosen.simulated:
        return False, (f"{pkg} (api={chosen.name!r}) is the nki_sim simulator (the Neuron "
                       f"toolchain is not installed, or NKI_PA_BACKEND={toolchain.BACKEND_REQUEST!r})")
    return True, f"torch-neuronx, torch-xla and {pkg} (api={chosen.name!r}) are importable"


def require_toolchain(op: str, api: str | None = None) -> None:
    """Raise ``NotImplementedError`` unless :func:`toolchain_status` says available."""
    ok, why = toolchain_status(api)
    if not ok:
        raise NotImplementedError(
            f"nki_pa::{op} on an XLA device needs the Neuron toolchain (torch-neuronx, torch-xla, "
            f"neuronx-cc; docs/integration.md 'Device path'): {why}. Move the tensors to the CPU "
            "to run the kernels through the host API instead.")


def launch(kernel: Any, grid: tuple[int, int] | None, *args: Any, api: str | None = None,
           lnc: int | None = None, item_parts: int = 1, **kwargs: Any) -> Any:
    """Call an ``@nki.jit`` kernel on torch tensors (torch-neuronx lowers it into the XLA graph)
    and return its output. A legacy-only kernel (a benchmark baseline) runs as
    ``kernel[grid](...)`` (``grid`` None: no grid). A kernel with both APIs (``nki_kernels.ops.KernelFamily``; ``grid`` None:
    a cache kernel, which splits its rows between the launch's cores) runs on
    ``nki_kernels.toolchain.resolve_api(api)``: legacy ``kernel[1, Hkv](...)`` with ``grid = (1,
    Hkv)``, current ``kernel(...)`` -- one launch at neuronx-cc's LNC (``NEURON_CC_FLAGS``'
    ``--lnc``, else ``NEURON_LOGICAL_NC_CONFIG``, else 2 on trn2 / trn3; an ``lnc`` that differs
    is a ValueError: ``nki_kernels.toolchain.Api.lnc``), the kernel looping over its KV heads
    (or, for a schedule cut in ``item_parts`` parts, each core over its part of the items)."""
    from nki_kernels.ops import KernelFamily

    if isinstance(kernel, KernelFamily):
        from nki_kernels import toolchain

        chosen = toolchain.resolve_api(api)
        return chosen.launch(kernel, args, kwargs, num_kv_heads=None if grid is None else grid[1],
                             device=True, lnc=lnc, item_parts=item_parts)
    return (kernel[grid] if grid else kernel)(*args, **kwargs)


def register_device_kernels(paged_attention_op: Any, reshape_and_cache_op: Any,
                            copy_blocks_op: Any) -> None:
    """Register the XLA kernels of the three ``nki_pa`` ops (called by ``host.serving.torch_ops``)."""
    paged_attention_op.register_kernel("xla")(_paged_attention_xla)
    reshape_and_cache_op.register_kernel("xla")(_reshape_and_cache_xla)
    copy_blocks_op.register_kernel("xla")(_copy_blocks_xla)


def _paged_attention_xla(query, key, value, kv_cache, block_tables, query_lens, context_lens,
                         softmax_scale=None, mixed_precision=True, large_tile_size=None,
                         gqa_packing=None, attention_kernel=None, sliding_window=None,
                         logits_soft_cap=None, alibi_slopes=None, sinks=None, k_scale=None,
                         v_scale=None, api=None, value_cache=None):
    require_toolchain("paged_attention", api)
    if k_scale is not None or v_scale is not None:
        raise NotImplementedError("the XLA device path reads float32 / bfloat16 / float16 caches "
                                  "only; fp8 caches (k_scale / v_scale) need CPU tensors")
    return device_paged_attention(query, key, value, kv_cache, block_tables, query_lens,
                                  context_lens, softmax_scale=softmax_scale,
                                  mixed_precision=mixed_precision, large_tile_size=large_tile_size,
                                  gqa_packing=gqa_packing, kernel=attention_kernel or "scheduled",
                                  sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                                  alibi_slopes=alibi_slopes, sinks=sinks, api=api,
                                  value_cache=value_cache)


def _reshape_and_cache_xla(key, value, kv_cache, slot_mapping, k_scale=None, v_scale=None,
                           value_cache=None):
    require_toolchain("reshape_and_cache")
    if k_scale is not None or v_scale is not None:
        raise NotImplementedError("the XLA device path writes float32 / bfloat16 / float16 caches "
                                  "only; fp8 caches (k_scale / v_scale) need CPU tensors")
    device_reshape_and_cache(key, value, kv_cache, slot_mapping, value_cache=value_cache)


def _copy_blocks_xla(kv_caches, block_mapping):
    require_toolchain("copy_blocks")
    device_copy_blocks(kv_caches, block_mapping)


def device_paged_attention(query, key, value, kv_cache, block_tables, query_lens, context_lens, *,
                           softmax_scale=None, mixed_precision=True, large_tile_size=None,
                           gqa_packing=None, kernel="scheduled", sliding_window=None,
                           logits_soft_cap=None, alibi_slopes=None, sinks=None, api=None,
                           value_cache=None):
    """:func:`host.paged_attention` with torch tensors kept on their device (module docstring).

    Shapes as ``host.paged_attention``: ``kv_cache`` (2, N, Hkv, B, d), or with ``value_cache``
    vLLM's block-KV pair, ``kv_cache`` the key cache and ``value_cache`` the value cache, (N, B,
    Hkv, d) each, read in place (scheduled kernel); the plan is ``host.plan_cache.cached_plan``
    of the host copies of the lengths and block tables (one per step for all layers). Returns
    (T, H, d) on query's device.
    """
    pair = value_cache is not None
    if query.dim() != 3:
        fail("query", "be (T, H, d)", f"shape {tuple(query.shape)}")
    N, B, Hkv, _ = _cache_dims(kv_cache, value_cache)
    T, H, d = query.shape
    for name, t in (("key", key), ("value", value)):
        if tuple(t.shape) != (T, Hkv, d) or t.dtype != query.dtype:
            fail(name, f"be (T, Hkv, d) = {(T, Hkv, d)} in {query.dtype}",
                 f"{tuple(t.shape)} {t.dtype}")
    if kv_cache.dtype != query.dtype:
        fail("kv_cache.dtype", f"equal query.dtype ({query.dtype})", str(kv_cache.dtype))
    layer = dict(alibi_slopes=_host_or_none(alibi_slopes), sinks=_host_or_none(sinks))
    plan = cached_plan(_host(block_tables), _host(query_lens), _host(context_lens), num_heads=H,
                       num_kv_heads=Hkv, head_size=d, block_size=B, num_blocks=N,
                       dtype=_numpy_dtype(query.dtype), softmax_scale=softmax_scale,
                       mixed_precision=mixed_precision,
                       large_tile_size="auto" if large_tile_size is None else large_tile_size,
                       backend="neuron", gqa_packing="auto" if gqa_packing is None else gqa_packing,
                       kernel=kernel, sliding_window=sliding_window,
                       logits_soft_cap=logits_soft_cap, api=api,
                       kv_layout=BLOCK_KV if pair else FUSED, **layer)
    if plan.num_tokens != T:
        fail("query_lens", f"sum to query.shape[0] = {T}", f"sum {plan.num_tokens}")
    if plan.kernel == "dense":
        return _device_dense(plan, query, key, value, kv_cache)
    return _device_scheduled(plan, query, key, value, (kv_cache, value_cache) if pair else kv_cache,
                             layer)


def _device_scheduled(plan, query, key, value, kv_cache, layer):
    """The scheduled kernel on device tensors: gathers build the per-layer inputs; ``kv_cache``
    the fused cache or the block-KV ``(key_cache, value_cache)`` pair (read in place)."""
    import torch

    from nki_kernels.scheduled.scheduled_attention import scheduled_paged_attention
    from nki_kernels.scheduled.scheduled_pair import scheduled_pair_attention

    _, launches = layer_launches(plan, **layer)
    T, H, d = query.shape
    N, Hkv = plan.num_blocks, plan.num_kv_heads
    pair = plan.kv_layout == BLOCK_KV
    dev = query.device
    idx = lambda a: torch.from_numpy(np.array(a)).to(dev)  # noqa: E731  (a writable copy)
    cache_dtype = (kv_cache[0] if pair else kv_cache).dtype
    new = torch.stack([key, value]).to(cache_dtype).reshape(2, T * Hkv, d)   # row t*Hkv + h
    qflat = torch.cat([query.reshape(T * H, d), query.new_zeros((1, d))])
    result = query.new_zeros((T * H, d))
    on_dev = lambda a: idx(a) if isinstance(a, np.ndarray) else a  # noqa: E731
    kv_arg, extra = (kv_cache[0], {"value_cache": kv_cache[1]}) if pair else (kv_cache, {})
    built = []
    for part, launch_in in zip(plan.parts, launches):
        ov = overlay_index(part.schedule, plan.block_tables, num_blocks=N, num_tokens=T)
        overlay = _device_overlay(ov, kv_cache, new, pair, idx)
        cls = launch_in.cls
        qi = query_index(cls, H, Hkv, T)
        qt = qflat[idx(qi.reshape(-1))].reshape(Hkv, cls.num_blocks, cls.rows, d)
        qt = group_major(qt.permute(0, 1, 3, 2), cls.blocks).contiguous()
        item_q = (tuple(_item_queries(cls, qt, p, Hkv, idx) for p in (cls.full, cls.partial))
                  if cls.decode_layout else None)
        built.append(launch_args(launch_in, qt, kv_arg, overlay, item_q=item_q))
    run = dict(api=plan.api, lnc=plan.lnc, item_parts=launches[0].cls.item_parts)
    if plan.fused:        # both classes in one launch, their items interleaved
        args, inputs = pair_launch_args(*built)
        first, second = (part.kernel_kwargs["options"] for part in plan.parts)
        outs = launch(scheduled_pair_attention, (1, Hkv), *map(on_dev, args), options=first,
                      options_b=second, **run, **extra,
                      **{n: on_dev(a) for n, a in inputs.items()})
    else:
        outs = [launch(scheduled_paged_attention, (1, Hkv), *map(on_dev, args),
                       **part.kernel_kwargs, **run, **extra,
                       **{n: on_dev(a) for n, a in inputs.items()})
                for part, (args, inputs) in zip(plan.parts, built)]
    for launch_in, out in zip(launches, outs):
        cls = launch_in.cls
        rows, dst = output_index(cls, H, Hkv)
        out = block_major(out, Hkv, cls.blocks, cls.rows, d)
        result[idx(dst)] = out.reshape(-1, d)[idx(rows)].to(result.dtype)
    return result.reshape(T, H, d)


def _device_overlay(ov, cache, new, pair, idx):
    """The rows ``ov`` (``host.scheduled.scheduled_index.overlay_index``: cache row ``(block *
    Hkv + head) * B + offset``, then new-token row ``N * Hkv * B + t * Hkv + head``, then the zero
    row) gathered on the device, ``(2, Hkv * R, b' * d)``: cache rows from ``cache`` (fused (2,
    N, Hkv, B, d), or the block-KV pair, where that row is ``(block * B + offset) * Hkv + head``
    of either (N * B * Hkv, d) view), new-token rows from ``new`` (2, T * Hkv, d). Two gathers
    and two selects, never a copy of the whole cache; the rows a select drops are gathered from
    row 0, whose values (a NaN included) never reach the result."""
    import torch

    if pair:
        N, B, Hkv, d = cache[0].shape
    else:
        _, N, Hkv, B, d = cache.shape
    rows = ov.reshape(-1)
    n_cache = N * Hkv * B
    in_cache = rows < n_cache
    in_new = ~in_cache & (rows < n_cache + new.shape[1])
    if pair:
        blk, rest = np.divmod(rows, Hkv * B)
        head, off = np.divmod(rest, B)
        crow = np.where(in_cache, (blk * B + off) * Hkv + head, 0)
        got = torch.stack([c.reshape(N * B * Hkv, d)[idx(crow)] for c in cache])
    else:
        got = cache.reshape(2, n_cache, d)[:, idx(np.where(in_cache, rows, 0))]
    fresh = new[:, idx(np.where(in_new, rows - n_cache, 0))]
    zero = torch.zeros_like(got)
    out = torch.where(idx(in_cache)[None, :, None], got,
                      torch.where(idx(in_new)[None, :, None], fresh, zero))
    return out.reshape(2, ov.shape[0], ov.shape[1] * d)


def _item_queries(cls, qt, phase, Hkv, idx):
    """``host.scheduled.scheduled.item_queries`` of a keys-on-partitions class as a device gather."""
    import torch

    d = qt.shape[0] // (Hkv * cls.num_blocks)
    q4 = qt.reshape(Hkv, cls.num_blocks, d, cls.rows)
    blk = phase.item_block
    sel = q4[:, idx(np.maximum(blk, 0))]
    sel = torch.where(idx(blk >= 0)[None, :, None, None], sel, torch.zeros_like(sel))
    return sel.permute(0, 2, 1, 3).reshape(Hkv * d, blk.shape[0] * cls.rows)


def _device_dense(plan, query, key, value, kv_cache):
    """The dense (vLLM-interface) kernel on device tensors: Q/K/V (GQA-packed when the plan
    packs: ``host.dense.gqa_packing``'s index maps as torch views) padded and transposed with
    torch ops, the plan's active block table and mask moved to the device."""
    import torch

    from nki_kernels.dense.flash_paged_attention import flash_paged_attention

    T0, H0, d = query.shape
    Hkv, dev = plan.num_kv_heads, query.device
    if plan.dense.gqa_packed:      # (T, H, d) -> (T*G, Hkv, d): row t*G + g, head h = query head h*G + g
        G = H0 // Hkv
        query = query.reshape(T0, Hkv, G, d).permute(0, 2, 1, 3).reshape(T0 * G, Hkv, d)
        key, value = (x.repeat_interleave(G, dim=0) for x in (key, value))
    T, H, _ = query.shape
    Qpad = plan.dense.batch.padded_queries
    active = torch.from_numpy(plan.dense.active_table.copy()).to(dev)
    mask = torch.from_numpy(plan.dense.mask.copy()).to(dev)
    q_in = query.new_zeros((1, H, d, Qpad))
    q_in[0, :, :, :T] = query.permute(1, 2, 0)
    k_in = query.new_zeros((1, Hkv, d, Qpad))
    k_in[0, :, :, :T] = key.permute(1, 2, 0)
    v_in = query.new_zeros((1, Hkv, Qpad, d))
    v_in[0, :, :T, :] = value.permute(1, 0, 2)
    out = launch(flash_paged_attention, (1, Hkv), q_in, k_in, v_in, kv_cache, active,
                 mask, api=plan.api, lnc=plan.lnc, **plan.kernel_kwargs)
    out = out[0, :, :T, :].permute(1, 0, 2)
    if H != H0:                    # unpack: result[t, h*G + g] = out[t*G + g, h]
        out = out.reshape(T0, H0 // Hkv, Hkv, d).permute(0, 2, 1, 3).reshape(T0, H0, d)
    return out.contiguous()


def device_reshape_and_cache(key, value, kv_cache, slot_mapping, *, value_cache=None) -> None:
    """:func:`host.reshape_and_cache` with torch tensors kept on their device (in place):
    ``kv_cache`` (2, N, Hkv, B, d), or with ``value_cache`` vLLM's block-KV pair (``kv_cache``
    the key cache, ``value_cache`` the value cache, (N, B, Hkv, d) each)."""
    import torch

    pair = value_cache is not None
    N, B, Hkv, d = _cache_dims(kv_cache, value_cache)
    if key.dim() != 3 or tuple(key.shape[1:]) != (Hkv, d) or value.shape != key.shape:
        fail("key / value", f"be (T, {Hkv}, {d}) to match kv_cache",
             f"{tuple(key.shape)} / {tuple(value.shape)}")
    slots = check_slot_mapping(_host(slot_mapping), num_tokens=key.shape[0], num_slots=N * B,
                               tokens_arg="key")
    if not (slots >= 0).any():
        return
    k_new, v_new = (x.to(kv_cache.dtype).contiguous() for x in (key, value))
    if pair:
        from nki_kernels.cache.kv_cache_update import kv_cache_update_blocks

        rows, row_elems = block_kv_write_rows(slots, num_slots=N * B, num_kv_heads=Hkv,
                                              head_size=d, itemsize=kv_cache.element_size())
        out = launch(kv_cache_update_blocks, None, k_new, v_new, kv_cache, value_cache,
                     torch.from_numpy(rows).to(kv_cache.device), row_elems=row_elems)
        _write_back(kv_cache, out[0])
        _write_back(value_cache, out[1])
        return
    rows = cache_write_row_index(slots, num_blocks=N, num_kv_heads=Hkv, block_size=B)
    from nki_kernels.cache.kv_cache_update import kv_cache_update

    out = launch(kv_cache_update, None, k_new, v_new, kv_cache,
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
    from nki_kernels.cache.block_copy import copy_cache_blocks

    out = launch(copy_cache_blocks, None, whole, torch.from_numpy(pairs).to(whole.device),
                 row_elems=f)
    _write_back(whole, out)


def _cache_dims(kv_cache: Any, value_cache: Any) -> tuple[int, int, int, int]:
    """``(N, B, Hkv, d)`` of a fused ``kv_cache`` (2, N, Hkv, B, d) or, with ``value_cache``, of
    vLLM's block-KV pair (two (N, B, Hkv, d) caches of one dtype); ValueError naming them."""
    if value_cache is None:
        if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
            fail("kv_cache", "have shape (2, num_blocks, Hkv, block_size, d)",
                 f"shape {tuple(kv_cache.shape)}")
        _, N, Hkv, B, d = kv_cache.shape
        return N, B, Hkv, d
    if (kv_cache.dim() != 4 or tuple(value_cache.shape) != tuple(kv_cache.shape)
            or value_cache.dtype != kv_cache.dtype):
        fail("kv_cache / value_cache", "be two (num_blocks, block_size, Hkv, d) caches of one dtype",
             f"{tuple(kv_cache.shape)} {kv_cache.dtype} / {tuple(value_cache.shape)} "
             f"{value_cache.dtype}")
    if _shares_bytes(kv_cache, value_cache):
        fail("kv_cache / value_cache", "be non-overlapping key and value caches",
             "two caches sharing memory")
    return tuple(kv_cache.shape)


def _shares_bytes(a: Any, b: Any) -> bool:
    """Whether two tensors' element ranges overlap: the same tensor, or data pointers whose
    ``numel * element_size`` ranges intersect (a tensor with no host-visible data pointer, 0 or
    an error, is compared by identity only)."""
    if a is b:
        return True
    try:
        a0, b0 = a.data_ptr(), b.data_ptr()
    except RuntimeError:
        return False
    if not a0 or not b0:
        return False
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _host_or_none(t: Any) -> np.ndarray | None:
    return None if t is None else _host(t)


def _numpy_dtype(torch_dtype: Any) -> np.dtype:
    """The NumPy / ml_dtypes dtype of a torch float dtype (float32, bfloat16, float16)."""
    name = str(torch_dtype).removeprefix("torch.")
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _host(t: Any) -> np.ndarray:
    """A small index tensor as a host NumPy array (a device sync for XLA tensors)."""
    if hasattr(t, "detach"):
        t = t.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            import ml_dtypes

            import torch

            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()
    return np.asarray(t)


def _write_back(dst: Any, out: Any) -> None:
    """Mutable-tensor kernels return the updated tensor; copy it into ``dst`` unless it is the
    ``dst`` object itself. Never by comparing data pointers: an XLA tensor has no host storage
    (``data_ptr()`` raises, or is 0 for every functionalized tensor), and a custom call returns a
    new tensor, so a pointer test would skip the copy and leave the cache stale."""
    if out is not None and out is not dst:
        dst.copy_(out)
