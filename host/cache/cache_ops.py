"""KV-cache operations on the paged cache (2, N, Hkv, B, d): write new tokens, copy and swap blocks.

vLLM names and argument orders:

    reshape_and_cache(key, value, kv_cache, slot_mapping)   # kernel nki_kernels.cache.kv_cache_update
    copy_blocks(kv_caches, block_mapping)                   # kernel nki_kernels.cache.block_copy.copy_cache_blocks
    swap_blocks(src_cache, dst_cache, block_mapping)        # kernel nki_kernels.cache.block_copy.swap_cache_blocks

FP8 caches (float8_e4m3fn / float8_e5m2, vLLM's formats): ``reshape_and_cache`` quantizes in the
kernel with ``k_scale`` / ``v_scale`` (required; per tensor or per KV head); the block copies move
the bytes unchanged. The kernels see a float8_e4m3fn cache through its float8_e4m3 byte view
(host/fp8.py, docs/attention-variants.md).

``api``: which NKI API runs the kernel -- "legacy" (``neuronxcc.nki``; trn1), "nki" (the current
``nki``; trn2 / trn3) or None / "auto" (``nki_kernels.toolchain.resolve_api``: the installed toolchain,
else the simulator target's API); a bad value is a ValueError before anything is written.

``lnc``: physical cores of the launch (``nki_kernels.toolchain.Api.lnc``: the argument, else
``NEURON_LOGICAL_NC_CONFIG``, else the platform's: 2 on trn2 / trn3 -- on a device the
compiler's, which every kernel of a model must match, error EVRF066). On the current API at
LNC 2 the two cores split the rows (``nki_kernels.row_tiles``, "Cores"); the legacy API runs
one program (legacy SDKs have no LNC check). 2 on trn1 is a NotImplementedError.

All three update the destination cache IN PLACE and validate everything (shapes, dtypes, every
slot / block id, duplicates, overlaps) before the kernel runs, so a rejected call leaves the
cache byte-identical. The host builds one int32 row index per moved row (cheap O(rows) NumPy);
the kernels move up to 128 rows per indirect DMA. See the kernel modules for the DMA counts.

Layouts (C order):
    kv_cache           (2, N, Hkv, B, d)   [0] = K, [1] = V; slot s = block * B + offset
    kv_cache row view  (2, N*Hkv*B, d)     row(block, head, offset) = (block*Hkv + head)*B + offset
    block row view     (L*2*N*n_sub, F)    one (layer, kv, block) slab of S = Hkv*B*d elements is
                                           n_sub = S // F rows of F elements (F | S, F*itemsize <= max_row_bytes)
    MLA latent cache   (N, B, E)           copy_blocks / swap_blocks also take these (docs/layouts.md §12):
                                           viewed as (1, N, 1, B, E), one K/V "half" (no separate V)

Arrays: NumPy arrays are updated in place. CPU torch tensors are accepted too and updated in
place through a shared-memory NumPy view (bf16 via an int16 view); other torch devices raise
NotImplementedError (on Trainium the kernels are called through torch-xla, not this wrapper).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from host._arrays import is_torch_tensor, take_result, to_numpy
from host.cache.kernel_runs import resolve_kernel_api, take_rows
from host.cache.block_kv import block_kv_layers, check_new_kv, is_block_kv, reshape_and_cache_blocks
from host.fp8 import cache_write_row_scales, is_fp8_cache_dtype, kernel_cache_view, normalize_kv_scales
from host.cache.mla_layout import check_mla_cache
from host.validation import (check_index_range, check_int, check_integer_array,
                             check_slot_mapping, fail)

__all__ = [
    "reshape_and_cache",
    "writable_array",
    "check_int32_rows",
    "copy_layers",
    "resolve_kernel_api",
    "copy_blocks",
    "swap_blocks",
    "allocate_kv_caches",
    "kv_caches_share_buffer",
    "cache_write_row_index",
    "block_row_len",
    "block_copy_row_pairs",
    "check_block_mapping",
]

_CACHE_DTYPES = ("float32", "bfloat16", "float16")
_INT32_MAX = np.iinfo(np.int32).max
DEFAULT_MAX_ROW_BYTES = 16 * 1024  # >= 4 KiB per partition saturates DMA; 16 KiB keeps SBUF small


# ----------------------------------------------------------------------------- arrays and checks


def writable_array(x: Any, name: str) -> np.ndarray:
    """A NumPy array sharing memory with ``x`` (NumPy array or CPU torch tensor), writable, C-contiguous."""
    if is_torch_tensor(x):
        if x.device.type != "cpu":
            raise NotImplementedError(f"{name} on torch device {x.device} is not supported by the host "
                                      "wrapper; call it with a CPU tensor (or a NumPy array)")
        if not x.is_contiguous():
            fail(name, "be contiguous (it is updated in place)", f"strides {tuple(x.stride())}")
        import torch

        t = x.detach()
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            import ml_dtypes

            return t.view(torch.uint8).numpy().view(getattr(ml_dtypes, str(t.dtype).removeprefix("torch.")))
        return t.numpy()
    if not isinstance(x, np.ndarray):
        fail(name, "be a NumPy array or a CPU torch tensor (it is updated in place)", type(x).__name__)
    if not x.flags.c_contiguous:
        fail(name, "be C-contiguous (it is updated in place)", f"strides {x.strides}")
    if not x.flags.writeable:
        fail(name, "be writeable (it is updated in place)", "a read-only array")
    return x


def _check_cache(name: str, cache: np.ndarray) -> None:
    if cache.ndim != 5 or cache.shape[0] != 2:
        fail(name, "have shape (2, num_blocks, num_kv_heads, block_size, head_size)", f"shape {cache.shape}")
    if cache.dtype.name not in _CACHE_DTYPES and not is_fp8_cache_dtype(cache.dtype):
        if cache.dtype.name.startswith("float8"):
            raise NotImplementedError(f"{name}: a {cache.dtype.name} KV cache is not supported; "
                                      "use float32, bfloat16, float16, float8_e4m3fn or float8_e5m2")
        fail(name, f"have dtype in {_CACHE_DTYPES} or float8_e4m3fn / float8_e5m2", f"dtype {cache.dtype}")
    if min(cache.shape) == 0:
        fail(name, "have no zero-sized dimension", f"shape {cache.shape}")


def _block_layout(name: str, cache: np.ndarray) -> np.ndarray:
    """``cache`` in the (halves, N, Hkv, B, d) layout of the block-copy kernels: a paged KV cache
    (2, N, Hkv, B, d) as it is, an MLA cache (N, B, E) as the view (1, N, 1, B, E)."""
    if cache.ndim == 3:
        N, B, E = check_mla_cache(name, cache)
        return cache.reshape(1, N, 1, B, E)
    _check_cache(name, cache)
    return cache


def check_int32_rows(what: str, value: int) -> None:
    if value > _INT32_MAX:
        raise NotImplementedError(f"{what} = {value} exceeds the int32 DMA index range; "
                                  "split the cache into smaller tensors")


# ----------------------------------------------------------------------------- reshape_and_cache


def cache_write_row_index(slot_mapping: np.ndarray, *, num_blocks: int, num_kv_heads: int,
                          block_size: int) -> np.ndarray:
    """Destination rows of the (2, N*Hkv*B, d) cache view for the (T*Hkv, d) key / value rows.

    Input row q = t * Hkv + h goes to row (slot // B * Hkv + h) * B + slot % B; a negative slot
    maps to 2 * N * Hkv * B, out of bounds of the whole cache, which the kernel's
    ``oob_mode.skip`` stores drop. Returns int32 (T * Hkv, 1). Slots are assumed validated.
    """
    slots = np.asarray(slot_mapping, dtype=np.int64)
    blk, off = np.divmod(slots, block_size)
    heads = np.arange(num_kv_heads, dtype=np.int64)
    rows = (blk[:, None] * num_kv_heads + heads[None, :]) * block_size + off[:, None]
    rows = np.where(slots[:, None] < 0, 2 * num_blocks * num_kv_heads * block_size, rows)
    return rows.reshape(-1, 1).astype(np.int32)


def reshape_and_cache(key: Any, value: Any, kv_cache: Any, slot_mapping: Any, *,
                      k_scale: Any = None, v_scale: Any = None, api: Any = None,
                      lnc: Any = None) -> Any:
    """Write new tokens' K and V into the paged cache in place (vLLM ``reshape_and_cache``).

    Args:
        key, value: (T, Hkv, d), floating (cast to the cache dtype, RNE).
        kv_cache: (2, N, Hkv, B, d) float32 / bfloat16 / float16 / float8_e4m3fn / float8_e5m2,
            C-contiguous, updated in place; or vLLM's block-KV layout, a (key_cache,
            value_cache) pair of (N, B, Hkv, d) float32 / bfloat16 / float16 caches
            (host/cache/block_kv.py), updated in place (returned as given).
        slot_mapping: (T,) integer; slot = block * B + offset. Negative slots (padding) are skipped
            and touch nothing; every other slot must be < N * B and appear at most once.
        k_scale, v_scale: fp8 caches only (then both required): a positive float or float32
            (Hkv,) per KV head. The cache receives fp8(clamp(float32(x) * float32(1 / scale), -S, S)),
            round to nearest even, S = 240 for float8_e4m3fn (not 448: host/fp8.py) and 57344 for
            float8_e5m2.
        api: "legacy" | "nki" | None / "auto" (module docstring).
        lnc: physical cores of the launch, 1 | 2 | None (module docstring).

    Returns:
        ``kv_cache`` (the same object).

    Raises:
        ValueError: bad shapes / dtypes, a slot >= N * B, duplicate non-negative slots, a
            non-contiguous or read-only cache, missing scales for an fp8 cache or scales for a
            non-fp8 cache, an unknown ``api`` -- all before anything is written.
    """
    run_api = resolve_kernel_api(api, lnc)
    if is_block_kv(kv_cache):       # vLLM block-KV: (key_cache, value_cache), host/cache/block_kv.py
        return reshape_and_cache_blocks(key, value, kv_cache, slot_mapping, k_scale=k_scale,
                                        v_scale=v_scale, run_api=run_api, writable=writable_array,
                                        check_int32=check_int32_rows)
    cache = writable_array(kv_cache, "kv_cache")
    _check_cache("kv_cache", cache)
    _, n_blocks, n_heads, block_size, head_size = cache.shape
    k_sc, v_sc = normalize_kv_scales(cache.dtype, n_heads, k_scale, v_scale)
    k, v = check_new_kv(key, value, n_heads, head_size)
    n_slots = n_blocks * block_size
    slots = check_slot_mapping(slot_mapping, num_tokens=k.shape[0], num_slots=n_slots, tokens_arg="key")
    check_int32_rows("2 * num_blocks * num_kv_heads * block_size", 2 * n_slots * n_heads)
    if not (slots >= 0).any():
        return kv_cache  # nothing to write (also covers T == 0)

    from nki_kernels.cache.kv_cache_update import kv_cache_update, kv_cache_update_fp8

    row_index = cache_write_row_index(slots, num_blocks=n_blocks, num_kv_heads=n_heads,
                                      block_size=block_size)
    if k_sc is not None:      # fp8: the kernel quantizes float32 / bf16 / fp16 rows (exact upcasts)
        in_dtype = k.dtype if k.dtype == v.dtype and k.dtype.name in _CACHE_DTYPES else np.float32
        view = kernel_cache_view(cache)
        out = run_api.run(kv_cache_update_fp8, np.ascontiguousarray(k, dtype=in_dtype),
                          np.ascontiguousarray(v, dtype=in_dtype), view, row_index,
                          cache_write_row_scales(k_sc, v_sc, k.shape[0]))
        take_rows(_row_view(view), out, row_index)
        return kv_cache
    key_c = np.ascontiguousarray(k.astype(cache.dtype, copy=False))    # no copy if already matching
    value_c = np.ascontiguousarray(v.astype(cache.dtype, copy=False))
    take_rows(_row_view(cache), run_api.run(kv_cache_update, key_c, value_c, cache, row_index),
              row_index)
    return kv_cache


def _row_view(cache: np.ndarray) -> np.ndarray:
    """The (2, N*Hkv*B, d) row view of a (2, N, Hkv, B, d) cache (``cache_write_row_index``)."""
    return cache.reshape(2, -1, cache.shape[4])



# ----------------------------------------------------------------------------- block copies


def block_row_len(slab_elems: int, itemsize: int, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> int:
    """Largest divisor F of ``slab_elems`` with F * itemsize <= max_row_bytes (at least 1)."""
    cap = max(1, max_row_bytes // itemsize)
    if slab_elems <= cap:
        return slab_elems
    divs = [x for i in range(1, int(slab_elems ** 0.5) + 1) if slab_elems % i == 0
            for x in (i, slab_elems // i)]
    return max(x for x in divs if x <= cap)


def block_copy_row_pairs(src_blocks: np.ndarray, dst_blocks: np.ndarray, *, num_layers: int,
                         src_num_blocks: int, dst_num_blocks: int, n_sub: int,
                         halves: int = 2) -> np.ndarray:
    """[source row, destination row] pairs (int32 (num_layers * halves * n * n_sub, 2)) for block copies.

    Row (layer, kv, block, j) of an (L*halves*N*n_sub, F) row view is
    ((layer*halves + kv)*N + block)*n_sub + j; halves = 2 (K, V), or 1 for an MLA cache.
    """
    lkv = np.arange(halves * num_layers, dtype=np.int64)[:, None, None]
    j = np.arange(n_sub, dtype=np.int64)[None, None, :]
    src = (lkv * src_num_blocks + np.asarray(src_blocks, np.int64)[None, :, None]) * n_sub + j
    dst = (lkv * dst_num_blocks + np.asarray(dst_blocks, np.int64)[None, :, None]) * n_sub + j
    return np.stack([src.ravel(), dst.ravel()], axis=1).astype(np.int32)


def check_block_mapping(block_mapping: Any, n_src: int, n_dst: int, *,
                        same_cache: bool) -> tuple[np.ndarray, np.ndarray]:
    """Validated (src, dst) int64 id vectors of an (n, 2) [src, dst] block mapping.

    Ids in [0, n_src) / [0, n_dst); destinations unique; with ``same_cache`` no block is both a
    source and a destination. Raises ``ValueError`` naming ``block_mapping``.
    """
    bm = check_integer_array("block_mapping", block_mapping)
    if bm.size == 0:
        bm = bm.reshape(0, 2)
    if bm.ndim != 2 or bm.shape[1] != 2:
        fail("block_mapping", "have shape (n, 2) of [src, dst] block ids", f"shape {bm.shape}")
    check_index_range("block_mapping[:, 0]", bm[:, 0], upper=n_src, what="source block ids")
    check_index_range("block_mapping[:, 1]", bm[:, 1], upper=n_dst, what="destination block ids")
    uniq, counts = np.unique(bm[:, 1], return_counts=True)
    if (counts > 1).any():
        fail("block_mapping", "not repeat a destination block (a DMA scatter to one block twice has "
             "no defined order)", f"repeated destinations {uniq[counts > 1][:8].tolist()}")
    if same_cache:
        both = np.intersect1d(bm[:, 0], bm[:, 1])
        if both.size:
            fail("block_mapping", "not use a block as both source and destination in one cache (the "
                 "coalesced copy reads all sources while it writes)", f"blocks {both[:8].tolist()}")
    return bm[:, 0], bm[:, 1]


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def kv_caches_share_buffer(kv_caches: Sequence[np.ndarray]) -> bool:
    """True if the layers are consecutive, equally shaped, C-contiguous pieces of one buffer.

    Then :func:`copy_blocks` runs on a zero-copy row view of all layers (e.g. caches from
    :func:`allocate_kv_caches`); otherwise it has to stack the layers on the host first.
    """
    first = kv_caches[0]
    root, base, size = _root(first), _addr(first), first.nbytes
    lo, hi = _addr(root), _addr(root) + root.nbytes
    return all(a.flags.c_contiguous and a.shape == first.shape and a.dtype == first.dtype
               and _root(a) is root and _addr(a) == base + i * size for i, a in enumerate(kv_caches)) \
        and lo <= base and base + len(kv_caches) * size <= hi and root.flags.c_contiguous


def allocate_kv_caches(num_layers: int, num_blocks: int, num_kv_heads: int, block_size: int,
                       head_size: int, dtype: Any = np.float32) -> list[np.ndarray]:
    """Zero-filled per-layer caches (2, N, Hkv, B, d) that are views of ONE contiguous buffer.

    ``copy_blocks`` on such a list is zero-copy on the host (one row view of all layers).

    Args:
        num_layers, num_blocks, num_kv_heads, block_size, head_size: integers >= 1 (Python or
            NumPy ints; bool and float are rejected).
        dtype: a cache dtype every cache operation accepts (float32, bfloat16, float16,
            float8_e4m3fn, float8_e5m2).

    Raises:
        ValueError: a bad size or dtype (names the argument), before anything is allocated.
        NotImplementedError: another float8 format.
    """
    from host.validation import check_int

    sizes = [check_int(name, value, min_value=1) for name, value in (
        ("num_layers", num_layers), ("num_blocks", num_blocks), ("num_kv_heads", num_kv_heads),
        ("block_size", block_size), ("head_size", head_size))]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        fail("dtype", f"be a NumPy / ml_dtypes cache dtype ({', '.join(_CACHE_DTYPES)}, float8_e4m3fn "
             "or float8_e5m2)", repr(dtype))
    _check_cache("dtype", np.empty((2, 1, 1, 1, 1), dt))   # the dtype rule of every cache operation
    buf = np.zeros((sizes[0], 2, *sizes[1:]), dtype=dt)
    return [buf[i] for i in range(sizes[0])]


def copy_layers(kv_caches: Any) -> list[np.ndarray]:
    """The validated per-layer caches :func:`copy_blocks` copies in (the paged and MLA layouts):
    writable, C-contiguous NumPy views (CPU torch tensors shared) in the block-copy layout, all
    of one shape and dtype, not overlapping. ``host.KVCacheManager`` checks its cache with it at
    construction. Raises the ValueError / NotImplementedError of ``copy_blocks``."""
    if isinstance(kv_caches, np.ndarray) or is_torch_tensor(kv_caches):
        whole = writable_array(kv_caches, "kv_caches")
        if whole.ndim not in (6, 4):
            fail("kv_caches", "be a list of (2, N, Hkv, B, d) or MLA (N, B, E) caches, or one "
                 "(L, 2, N, Hkv, B, d) or (L, N, B, E) array",
                 f"an array of shape {whole.shape}")
        layers = [whole[i] for i in range(whole.shape[0])]
    else:
        if not isinstance(kv_caches, (list, tuple)) or len(kv_caches) == 0:
            fail("kv_caches", "be a non-empty list of per-layer caches", repr(type(kv_caches).__name__))
        layers = [writable_array(c, f"kv_caches[{i}]") for i, c in enumerate(kv_caches)]
    if not layers:
        fail("kv_caches", "hold at least one layer", "0 layers")
    layers = [_block_layout(f"kv_caches[{i}]", c) for i, c in enumerate(layers)]
    for i, c in enumerate(layers):
        if c.shape != layers[0].shape or c.dtype != layers[0].dtype:
            fail(f"kv_caches[{i}]", f"have the shape {layers[0].shape} and dtype {layers[0].dtype} of "
                 "kv_caches[0]", f"shape {c.shape}, dtype {c.dtype}")
    if len({_addr(c) for c in layers}) != len(layers) or any(
            np.may_share_memory(a, b) for i, a in enumerate(layers) for b in layers[i + 1:]):
        fail("kv_caches", "hold distinct, non-overlapping layers", "two layers sharing memory")
    return layers


def copy_blocks(kv_caches: Any, block_mapping: Any, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
                api: Any = None, lnc: Any = None) -> None:
    """Copy blocks inside every layer's cache, all layers in ONE kernel launch (vLLM ``copy_blocks``).

    For every layer and both K and V: ``cache[:, dst] = cache[:, src]`` for each [src, dst] row of
    ``block_mapping``. The kernel sees all layers as one (L*2*N*n_sub, F) row tensor and moves
    128 rows per indirect DMA across layers, K / V and blocks.

    Host-side cost (be aware): a single kernel argument must hold every layer. If the layers are
    consecutive views of one buffer (:func:`allocate_kv_caches`, or a (L, 2, N, Hkv, B, d) array
    passed directly) the row view is free. Otherwise the layers are stacked with ``np.stack``
    (a full copy of all caches) and the destination blocks are copied back per layer afterwards
    -- correct, but it reads and writes every cache on the host; allocate with
    :func:`allocate_kv_caches` to avoid it (:func:`kv_caches_share_buffer` tells which path runs).

    Args:
        kv_caches: list of per-layer (2, N, Hkv, B, d) caches (same shape and dtype, C-contiguous,
            writeable), or one (L, 2, N, Hkv, B, d) array; or a list of per-layer vLLM block-KV
            (key_cache, value_cache) pairs of (N, B, Hkv, d) caches (host/cache/block_kv.py: one
            zero-copy launch per run of caches that are consecutive pieces of one buffer).
        block_mapping: (n, 2) integer [src, dst] block ids in [0, N); destinations unique; no block
            both a source and a destination.
        max_row_bytes: upper bound for one DMA row (a partition's share); rows are contiguous
            pieces of a (kv, block) slab.
        api: "legacy" | "nki" | None / "auto" (module docstring).
        lnc: physical cores of the launch, 1 | 2 | None (module docstring).

    Raises:
        ValueError: anything invalid (an unknown ``api`` or ``lnc`` included), before anything
            is written.
    """
    run_api = resolve_kernel_api(api, lnc)
    max_row_bytes = check_int("max_row_bytes", max_row_bytes, min_value=1)
    runs = block_kv_layers(kv_caches, writable_array, kv_caches_share_buffer)
    if runs is not None:            # vLLM block-KV pairs: zero-copy launches (host/cache/block_kv.py)
        for run in runs:
            copy_blocks(run, block_mapping, max_row_bytes=max_row_bytes, api=api, lnc=lnc)
        return
    layers = copy_layers(kv_caches)
    n_blocks = layers[0].shape[1]
    src, dst = check_block_mapping(block_mapping, n_blocks, n_blocks, same_cache=True)
    if src.size == 0:
        return

    n_layers, slab = len(layers), int(np.prod(layers[0].shape[2:]))
    f = block_row_len(slab, layers[0].itemsize, max_row_bytes)
    n_sub = slab // f
    halves = layers[0].shape[0]
    check_int32_rows("rows of the block row view", n_layers * halves * n_blocks * n_sub)
    pairs = block_copy_row_pairs(src, dst, num_layers=n_layers, src_num_blocks=n_blocks,
                                 dst_num_blocks=n_blocks, n_sub=n_sub, halves=halves)

    from nki_kernels.cache.block_copy import copy_cache_blocks

    if kv_caches_share_buffer(layers):
        # zero-copy view of all layers, built on bytes (as_strided cannot carry every ml_dtypes type)
        first = kernel_cache_view(layers[0])
        raw = np.lib.stride_tricks.as_strided(first.reshape(-1).view(np.uint8),
                                              shape=(n_layers, first.nbytes), strides=(first.nbytes, 1))
        whole = raw.view(first.dtype).reshape(n_layers, *first.shape)
        written = (slice(None), slice(None), dst)             # every layer's destination blocks
        take_result(whole, run_api.run(copy_cache_blocks, whole, pairs, row_elems=f), written)
        return
    stacked = np.stack(layers)  # host copy of all layers: see the docstring
    view = kernel_cache_view(stacked)
    take_result(view, run_api.run(copy_cache_blocks, view, pairs, row_elems=f),
                (slice(None), slice(None), dst))
    for layer, new in zip(layers, stacked):
        layer[:, dst] = new[:, dst]


def swap_blocks(src_cache: Any, dst_cache: Any, block_mapping: Any, *,
                max_row_bytes: int = DEFAULT_MAX_ROW_BYTES, api: Any = None,
                lnc: Any = None) -> None:
    """Copy blocks from one cache to another in place: ``dst_cache[:, d] = src_cache[:, s]`` (vLLM ``swap_blocks``).

    Args:
        src_cache: (2, Ns, Hkv, B, d) source (read only; e.g. the host cache).
        dst_cache: (2, Nd, Hkv, B, d) destination, same (Hkv, B, d) and dtype, C-contiguous, writeable.
        block_mapping: (n, 2) integer [src id in [0, Ns), dst id in [0, Nd)]; destinations unique.
            If both arguments are the same cache this is :func:`copy_blocks` on one layer (a block
            may then not be both a source and a destination); partially overlapping caches are rejected.
        api: "legacy" | "nki" | None / "auto" (module docstring).
        lnc: physical cores of the launch, 1 | 2 | None (module docstring).

    Raises:
        ValueError: anything invalid (an unknown ``api`` or ``lnc`` included), before anything
            is written.
    """
    run_api = resolve_kernel_api(api, lnc)
    max_row_bytes = check_int("max_row_bytes", max_row_bytes, min_value=1)
    for name, c in (("src_cache", src_cache), ("dst_cache", dst_cache)):
        if is_block_kv(c):
            raise NotImplementedError(
                f"swap_blocks: {name} is a block-KV (key_cache, value_cache) pair; swap each cache "
                "of the pair on its own, viewed as a one-half cache: (N, B, Hkv, d).reshape(1, N, "
                "1, B, Hkv * d)")
    dst_given = writable_array(dst_cache, "dst_cache")
    src_given, _ = to_numpy(src_cache, "src_cache")
    src = _block_layout("src_cache", src_given)
    dst = _block_layout("dst_cache", dst_given)
    if src.shape[2:] != dst.shape[2:] or src.shape[0] != dst.shape[0] or src.dtype != dst.dtype:
        fail("dst_cache", f"match src_cache in layout, (num_kv_heads, block_size, head_size) "
             f"{src.shape[2:]} and dtype {src.dtype}", f"shape {dst_given.shape}, dtype {dst.dtype}")
    if np.may_share_memory(src, dst):
        if src.shape == dst.shape and src.strides == dst.strides and _addr(src) == _addr(dst):
            copy_blocks([dst_given], block_mapping, max_row_bytes=max_row_bytes, api=api,
                        lnc=lnc)
            return
        fail("src_cache", "not partially overlap dst_cache in memory", "overlapping arrays")
    s_ids, d_ids = check_block_mapping(block_mapping, src.shape[1], dst.shape[1], same_cache=False)
    if s_ids.size == 0:
        return

    slab = int(np.prod(dst.shape[2:]))
    f = block_row_len(slab, dst.itemsize, max_row_bytes)
    n_sub = slab // f
    check_int32_rows("rows of the block row view", dst.shape[0] * max(src.shape[1], dst.shape[1]) * n_sub)
    pairs = block_copy_row_pairs(s_ids, d_ids, num_layers=1, src_num_blocks=src.shape[1],
                                 dst_num_blocks=dst.shape[1], n_sub=n_sub, halves=dst.shape[0])

    from nki_kernels.cache.block_copy import swap_cache_blocks

    # np.ascontiguousarray copies only a non-contiguous source (the source is read, never written)
    view = kernel_cache_view(dst)
    take_result(view, run_api.run(swap_cache_blocks, kernel_cache_view(np.ascontiguousarray(src)),
                                  view, pairs, row_elems=f), (slice(None), d_ids))
