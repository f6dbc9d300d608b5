"""vLLM's block-KV layout: one ``(N, B, Hkv, d)`` tensor per K and per V.

vLLM (``kv_cache.unbind(0)`` of a per-layer ``(2, N, B, Hkv, d)`` tensor) and vllm-neuron
(``(total_blocks, block_size, num_kv_heads, head_dim)``, block 0 the null block) hand the cache
over this way. ``host.reshape_and_cache`` and ``host.copy_blocks`` accept it as a
``(key_cache, value_cache)`` pair (per layer for ``copy_blocks``) and work on the arrays in
place, and the scheduled paged-attention kernel (``host.paged_attention``,
``host.run_paged_attention`` with ``kv_layout="block_kv"``) reads them in place -- no host copy
anywhere (docs/layouts.md §18). Layout functions here: :func:`check_pair` (shapes / dtypes of a
pair), :func:`kv_dims`, :func:`cached_tokens` (what the attention overlay copies) and the layout
transform :func:`fused_from_block_kv` with its inverse :func:`block_kv_from_fused` (copies, for
callers converting a cache; the kernels never need them).

    reshape_and_cache   slot s = block * B + offset is the contiguous run of Hkv * d elements
                        ``cache[s // B, s % B]``: the (N * B, Hkv * d) row view has row = slot
                        (``nki_kernels.cache.kv_cache_update.kv_cache_update_blocks``, one descriptor
                        per token and per K / V); rows over 16 KiB are (token, head) rows of d.
    copy_blocks         a block is a contiguous slab of B * Hkv * d elements, so each cache is the
                        one-"half" block view (N, B, Hkv * d) of the block-copy kernel, one launch
                        per run of caches that are consecutive pieces of one buffer.

Block 0 is a block like any other here (the null block of vllm-neuron is simply never named by a
valid slot or a block mapping; padding slots are negative and skipped).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host._arrays import is_torch_tensor, to_numpy
from host.cache.kernel_runs import take_rows
from host.validation import check_float_array, check_slot_mapping, fail
from nki_kernels.contract import CACHE_WRITE_MAX_ROW_BYTES

__all__ = ["is_block_kv", "check_pair", "inplace_array", "kv_dims", "cached_tokens",
           "fused_from_block_kv", "block_kv_from_fused", "check_new_kv", "block_kv_row_index",
           "block_kv_write_rows",
           "reshape_and_cache_blocks", "block_kv_layers"]

_DTYPES = ("float32", "bfloat16", "float16")
MAX_ROW_BYTES = CACHE_WRITE_MAX_ROW_BYTES     # the write kernel's largest row


def is_block_kv(kv_cache: Any) -> bool:
    """Whether ``kv_cache`` is a ``(key_cache, value_cache)`` pair (the block-KV layout)."""
    return isinstance(kv_cache, (tuple, list)) and len(kv_cache) == 2 and not isinstance(
        kv_cache[0], (tuple, list))


def inplace_array(x: Any, name: str) -> np.ndarray:
    """A NumPy array sharing memory with ``x`` (NumPy array or CPU torch tensor), C-contiguous
    (a kernel reads it in place: no copy is ever made); it may be read-only."""
    if is_torch_tensor(x):
        if x.device.type != "cpu":
            raise NotImplementedError(f"{name} on torch device {x.device} is not supported by the "
                                      "host wrapper; call it with a CPU tensor (or a NumPy array)")
        if not x.is_contiguous():
            fail(name, "be contiguous (the kernel reads it in place, without a copy)",
                 f"strides {tuple(x.stride())}")
        arr, _ = to_numpy(x, name)          # contiguous CPU tensors convert without a copy
        return arr
    if not isinstance(x, np.ndarray):
        fail(name, "be a NumPy array or a CPU torch tensor (read in place)", type(x).__name__)
    if not x.flags.c_contiguous:
        fail(name, "be C-contiguous (the kernel reads it in place, without a copy)",
             f"strides {x.strides}")
    return x


def kv_dims(kv_cache: Any) -> tuple[int, int, int, int]:
    """``(N, B, Hkv, d)`` of a checked cache in either layout: a fused (2, N, Hkv, B, d) array
    or a block-KV ``(key_cache, value_cache)`` pair of (N, B, Hkv, d) arrays."""
    if is_block_kv(kv_cache):
        N, B, Hkv, d = kv_cache[0].shape
        return N, B, Hkv, d
    _, N, Hkv, B, d = kv_cache.shape
    return N, B, Hkv, d


def cached_tokens(kv_cache: Any, blocks: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``(2, n, Hkv, d)``: K ([0]) and V ([1]) of the n cached tokens at (``blocks[i]``,
    ``offsets[i]``) of a fused cache or a block-KV pair (a gather of those tokens only)."""
    if is_block_kv(kv_cache):
        return np.stack([kv_cache[0][blocks, offsets], kv_cache[1][blocks, offsets]])
    return np.moveaxis(kv_cache[:, blocks, :, offsets, :], 0, 1)


def fused_from_block_kv(pair: Any) -> np.ndarray:
    """The layout transform: a ``(key_cache, value_cache)`` pair of (N, B, Hkv, d) caches as one
    fused (2, N, Hkv, B, d) cache (a copy): ``fused[0, n, h, t] = key_cache[n, t, h]``,
    ``fused[1, n, h, t] = value_cache[n, t, h]`` (docs/layouts.md §18)."""
    k, v = check_pair("pair", pair, lambda x, arg: to_numpy(x, arg)[0])
    return np.ascontiguousarray(np.stack([k, v]).transpose(0, 1, 3, 2, 4))


def block_kv_from_fused(kv_cache: Any) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`fused_from_block_kv`: a fused (2, N, Hkv, B, d) cache as a
    ``(key_cache, value_cache)`` pair of (N, B, Hkv, d) views of ONE new (2, N, B, Hkv, d)
    buffer (the per-layer tensor vLLM unbinds)."""
    kv = np.asarray(kv_cache)
    if kv.ndim != 5 or kv.shape[0] != 2:
        fail("kv_cache", "have shape (2, num_blocks, Hkv, block_size, d)", f"shape {kv.shape}")
    both = np.ascontiguousarray(kv.transpose(0, 1, 3, 2, 4))
    return both[0], both[1]


def check_pair(name: str, pair: Any, access=inplace_array) -> tuple[np.ndarray, np.ndarray]:
    """``(key_cache, value_cache)`` of a block-KV ``pair`` as NumPy arrays (``access(x, arg)``:
    :func:`inplace_array`, or a writable accessor for the cache ops): both (N, B, Hkv, d), no
    zero dimension, one float dtype, non-overlapping. ValueError naming the element otherwise;
    NotImplementedError for fp8 (the fused layout holds fp8 caches)."""
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        fail(name, "be a (key_cache, value_cache) pair of (N, B, Hkv, d) caches", repr(type(pair)))
    k = access(pair[0], f"{name}[0] (key_cache)")
    v = access(pair[1], f"{name}[1] (value_cache)")
    for arg, c in ((f"{name}[0] (key_cache)", k), (f"{name}[1] (value_cache)", v)):
        if c.ndim != 4 or min(c.shape) == 0:
            fail(arg, "have shape (num_blocks, block_size, num_kv_heads, head_size), no zero "
                 "dimension (vLLM block-KV layout)", f"shape {c.shape}")
        if c.dtype.name not in _DTYPES:
            if c.dtype.name.startswith("float8"):
                raise NotImplementedError(f"{arg}: a {c.dtype.name} block-KV cache is not "
                                          "supported; use the (2, N, Hkv, B, d) layout for fp8")
            fail(arg, f"have dtype in {_DTYPES}", f"dtype {c.dtype}")
    if v.shape != k.shape or v.dtype != k.dtype:
        fail(f"{name}[1] (value_cache)", f"have the shape {k.shape} and dtype {k.dtype} of the "
             "key cache", f"shape {v.shape}, dtype {v.dtype}")
    if np.may_share_memory(k, v):
        fail(name, "hold non-overlapping key and value caches", "two caches sharing memory")
    return k, v


def check_new_kv(key: Any, value: Any, num_kv_heads: int, head_size: int):
    """``key`` / ``value`` of a cache write as floating (T, Hkv, d) NumPy arrays (ValueError
    naming the argument otherwise); shared by both cache layouts."""
    k = check_float_array("key", key, ndim=3)
    v = check_float_array("value", value, ndim=3)
    if k.shape[1:] != (num_kv_heads, head_size):
        fail("key", f"have shape (T, {num_kv_heads}, {head_size}) to match kv_cache",
             f"shape {k.shape}")
    if v.shape != k.shape:
        fail("value", f"have the shape of key {k.shape}", f"shape {v.shape}")
    return k, v


def block_kv_row_index(slots: np.ndarray, *, num_slots: int, num_kv_heads: int,
                       per_head: bool) -> np.ndarray:
    """Destination rows of the (N*B, Hkv*d) view (row = slot) or, ``per_head``, of the
    (N*B*Hkv, d) view (row = slot * Hkv + head, rows q = t * Hkv + h); a negative slot maps to
    the row count (out of bounds: skipped). int32 (R, 1); slots are assumed validated."""
    s = np.asarray(slots, np.int64)
    if not per_head:
        return np.where(s < 0, num_slots, s).reshape(-1, 1).astype(np.int32)
    rows = s[:, None] * num_kv_heads + np.arange(num_kv_heads)[None, :]
    rows = np.where(s[:, None] < 0, num_slots * num_kv_heads, rows)
    return rows.reshape(-1, 1).astype(np.int32)


def block_kv_write_rows(slots: np.ndarray, *, num_slots: int, num_kv_heads: int, head_size: int,
                        itemsize: int) -> tuple[np.ndarray, int]:
    """``(row index, row_elems)`` of a block-KV write (``kv_cache_update_blocks``): one row of
    Hkv * d elements per token, or rows of d per (token, head) when a token's row is over the
    write kernel's largest row (:func:`block_kv_row_index`)."""
    per_head = num_kv_heads * head_size * itemsize > MAX_ROW_BYTES
    rows = block_kv_row_index(slots, num_slots=num_slots, num_kv_heads=num_kv_heads,
                              per_head=per_head)
    return rows, head_size if per_head else num_kv_heads * head_size


def reshape_and_cache_blocks(key, value, kv_cache, slot_mapping, *, k_scale, v_scale, run_api,
                             writable, check_int32) -> Any:
    """:func:`host.reshape_and_cache` on a ``(key_cache, value_cache)`` pair (module docstring)."""
    k_cache, v_cache = check_pair("kv_cache", kv_cache, writable)
    N, B, Hkv, d = k_cache.shape
    if k_scale is not None or v_scale is not None:
        fail("k_scale / v_scale", "be None for a non-fp8 cache", (k_scale, v_scale))
    k, v = check_new_kv(key, value, Hkv, d)
    slots = check_slot_mapping(slot_mapping, num_tokens=k.shape[0], num_slots=N * B,
                               tokens_arg="key")
    check_int32("num_blocks * block_size * num_kv_heads", N * B * Hkv)
    if not (slots >= 0).any():
        return kv_cache
    rows, row_elems = block_kv_write_rows(slots, num_slots=N * B, num_kv_heads=Hkv, head_size=d,
                                          itemsize=k_cache.itemsize)
    from nki_kernels.cache.kv_cache_update import kv_cache_update_blocks

    out = run_api.run(
        kv_cache_update_blocks, np.ascontiguousarray(k.astype(k_cache.dtype, copy=False)),
        np.ascontiguousarray(v.astype(k_cache.dtype, copy=False)), k_cache, v_cache, rows,
        row_elems=row_elems)
    for dst, got in zip((k_cache, v_cache), out):
        take_rows(dst.reshape(-1, row_elems), got, rows)
    return kv_cache


def block_kv_layers(kv_caches: Any, writable, share_buffer) -> list[list[np.ndarray]] | None:
    """``copy_blocks`` input in the block-KV layout (a list of per-layer (key_cache, value_cache)
    pairs) as runs of (N, B, Hkv*d) block views, each run consecutive pieces of one buffer (one
    zero-copy launch per run); None for any other input."""
    if not (isinstance(kv_caches, (tuple, list)) and kv_caches
            and all(isinstance(p, (tuple, list)) for p in kv_caches)):
        return None
    flat = []
    for i, pair in enumerate(kv_caches):
        flat.extend(check_pair(f"kv_caches[{i}]", pair, writable))
    for i, c in enumerate(flat):
        if c.shape != flat[0].shape or c.dtype != flat[0].dtype:
            fail(f"kv_caches[{i // 2}]", f"have the shape {flat[0].shape} and dtype "
                 f"{flat[0].dtype} of kv_caches[0]", f"shape {c.shape}, dtype {c.dtype}")
    if any(np.may_share_memory(a, b) for i, a in enumerate(flat) for b in flat[i + 1:]):
        fail("kv_caches", "hold distinct, non-overlapping caches", "two caches sharing memory")
    N, B, Hkv, d = flat[0].shape
    views = [c.reshape(N, B, Hkv * d) for c in flat]
    runs = [[views[0]]]
    for c in views[1:]:
        if share_buffer(runs[-1] + [c]):
            runs[-1].append(c)
        else:
            runs.append([c])
    return runs
