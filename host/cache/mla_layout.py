"""The MLA latent KV cache: entry size, allocation, validation, and reading entries back.

MLA (multi-head latent attention: DeepSeek V2/V3, Kimi, GLM) caches one latent "KV head" shared
by all query heads. Each token slot holds one entry of E elements (docs/layouts.md §12):

    kv_cache  (N, B, E)   slot s = block * B + offset  ->  entry kv_cache[s // B, s % B, :]
    entry     [ kv_c (R = kv_lora_rank) | k_pe (P = qk_rope_head_dim) | padding (E - R - P) ]

kv_c is the compressed latent (the attention values are its R elements; the keys are all R + P
elements of the entry). E is R + P rounded up so that E * itemsize is a multiple of
``entry_alignment_bytes`` (None: no padding, E = R + P). Padding elements are zero at allocation
and are never written by :func:`host.concat_and_cache_mla` nor read into any result.

    >>> import numpy as np, ml_dtypes
    >>> mla_entry_size(512, 64, ml_dtypes.bfloat16, 256), mla_entry_size(512, 64, np.float32, 256)
    (640, 576)
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from host._arrays import to_numpy
from host.validation import check_int, check_integer_array, fail

__all__ = [
    "MLA_CACHE_DTYPES",
    "mla_entry_size",
    "allocate_mla_cache",
    "check_mla_cache",
    "gather_mla_entries",
]

MLA_CACHE_DTYPES = ("float32", "bfloat16", "float16")


def _cache_dtype(arg: str, dtype: Any) -> np.dtype:
    """A supported cache dtype (fp32 / bf16 / fp16); fp8 is valid but unsupported."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        fail(arg, f"be a dtype in {MLA_CACHE_DTYPES}", repr(dtype))
    if dt.name.startswith("float8"):
        raise NotImplementedError(f"{arg}: a {dt.name} MLA cache is not supported; use a float32, "
                                  "bfloat16 or float16 cache")
    if dt.name not in MLA_CACHE_DTYPES:
        fail(arg, f"be in {MLA_CACHE_DTYPES}", f"dtype {dt}")
    return dt


def mla_entry_size(kv_lora_rank: int, qk_rope_head_dim: int, dtype: Any = ml_dtypes.bfloat16,
                   entry_alignment_bytes: int | None = None) -> int:
    """E_alloc: the smallest E >= kv_lora_rank + qk_rope_head_dim with E * itemsize a multiple of
    ``entry_alignment_bytes`` (any positive integer; None = no padding).

    E is a multiple of ``entry_alignment_bytes / gcd(entry_alignment_bytes, itemsize)`` elements:
    bf16 576 -> 640 at 256 B (128-element unit), fp32 576 -> 576 (2304 B = 9 x 256 B).
    """
    R = check_int("kv_lora_rank", kv_lora_rank, min_value=1)
    P = check_int("qk_rope_head_dim", qk_rope_head_dim, min_value=1)
    itemsize = _cache_dtype("dtype", dtype).itemsize
    if entry_alignment_bytes is None:
        return R + P
    align = check_int("entry_alignment_bytes", entry_alignment_bytes, min_value=1)
    unit = align // math.gcd(align, itemsize)
    return -(-(R + P) // unit) * unit


def allocate_mla_cache(num_blocks: int, block_size: int, *, kv_lora_rank: int = 512,
                       qk_rope_head_dim: int = 64, dtype: Any = ml_dtypes.bfloat16,
                       entry_alignment_bytes: int | None = None) -> np.ndarray:
    """A zero-filled MLA cache (num_blocks, block_size, E_alloc), E_alloc = :func:`mla_entry_size`.

    ``dtype`` is float32, bfloat16 (default; ``ml_dtypes.bfloat16``) or float16. Zero fill makes
    the padding elements [kv_lora_rank + qk_rope_head_dim, E_alloc) of every entry zero; nothing
    in the project writes them afterwards.
    """
    N = check_int("num_blocks", num_blocks, min_value=1)
    B = check_int("block_size", block_size, min_value=1)
    dt = _cache_dtype("dtype", dtype)
    E = mla_entry_size(kv_lora_rank, qk_rope_head_dim, dt, entry_alignment_bytes)
    return np.zeros((N, B, E), dtype=dt)


def check_mla_cache(arg: str, cache: np.ndarray, *, min_entry: int = 1) -> tuple[int, int, int]:
    """Validate an MLA cache array: 3-D (N, B, E), every dimension >= 1, E >= ``min_entry``
    (kv_lora_rank + qk_rope_head_dim), dtype fp32 / bf16 / fp16. Returns (N, B, E)."""
    if cache.ndim != 3:
        fail(arg, "have shape (num_blocks, block_size, entry_size) (an MLA latent cache)",
             f"shape {cache.shape}")
    _cache_dtype(f"{arg}.dtype", cache.dtype)
    if min(cache.shape) == 0:
        fail(arg, "have no zero-sized dimension", f"shape {cache.shape}")
    N, B, E = cache.shape
    if E < min_entry:
        fail(arg, f"have entries of >= kv_lora_rank + qk_rope_head_dim = {min_entry} elements "
             "(kv_cache.shape[2])", f"entry size {E} (shape {cache.shape})")
    return N, B, E


def gather_mla_entries(kv_cache: Any, slots: Any, *, kv_lora_rank: int = 512,
                       qk_rope_head_dim: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """``(kv_c (n, R), k_pe (n, P))`` read back from the entries of ``slots`` (n,) -- the inverse of
    :func:`host.concat_and_cache_mla` for those slots (padding elements are not returned).

    Entry of slot s: ``kv_cache[s // B, s % B]``; kv_c = its elements [0, R), k_pe = [R, R + P).
    Every slot must be in [0, N * B).
    """
    cache, _ = to_numpy(kv_cache, "kv_cache")
    R = check_int("kv_lora_rank", kv_lora_rank, min_value=1)
    P = check_int("qk_rope_head_dim", qk_rope_head_dim, min_value=1)
    N, B, _ = check_mla_cache("kv_cache", cache, min_entry=R + P)
    s = check_integer_array("slots", slots, ndim=1)
    if s.size and (s.min() < 0 or s.max() >= N * B):
        bad = int(np.argmax((s < 0) | (s >= N * B)))
        fail("slots", f"hold slots in [0, num_blocks * block_size = {N * B})", f"slots[{bad}] = {s[bad]}")
    entries = cache[s // B, s % B]                                    # (n, E)
    return entries[:, :R].copy(), entries[:, R:R + P].copy()
