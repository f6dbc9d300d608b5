"""Writing new tokens into the MLA latent cache (vLLM ``concat_and_cache_mla``).

    concat_and_cache_mla(kv_c (T, R), k_pe (T, P), kv_cache (N, B, E), slot_mapping (T,))

Token t's entry ``kv_cache[s // B, s % B]`` (s = slot_mapping[t]) receives ``[kv_c[t] | k_pe[t]]``
in its elements [0, R + P); padding elements [R + P, E) are never written (docs/layouts.md §12).
The kernel is ``nki_kernels.cache.mla_cache_update`` (one indirect store per 128 tokens); block copies
and swaps of MLA caches go through ``host.copy_blocks`` / ``host.swap_blocks``, which accept
(N, B, E) caches directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host.cache.cache_ops import check_int32_rows, writable_array
from host.cache.kernel_runs import resolve_kernel_api, take_rows
from host.cache.mla_layout import check_mla_cache
from host.validation import check_float_array, check_slot_mapping, fail

__all__ = ["concat_and_cache_mla", "mla_cache_write_row_index"]


def mla_cache_write_row_index(slot_mapping: np.ndarray, *, num_blocks: int, block_size: int) -> np.ndarray:
    """Destination rows of the (N * B, E) cache view: the slot itself; a negative slot maps to
    N * B, out of bounds of the axis and of the flattened cache, which the kernel's
    ``oob_mode.skip`` store drops. Returns int32 (T, 1). Slots are assumed validated."""
    slots = np.asarray(slot_mapping, dtype=np.int64)
    rows = np.where(slots < 0, num_blocks * block_size, slots)
    return rows.reshape(-1, 1).astype(np.int32)


def concat_and_cache_mla(kv_c: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any, *,
                         api: Any = None, lnc: Any = None) -> Any:
    """Write new tokens' latent ``kv_c`` and rotary key ``k_pe`` into the MLA cache in place.

    Args:
        kv_c: (T, R) floating, R = kv_lora_rank (cast to the cache dtype, RNE).
        k_pe: (T, P) floating, P = qk_rope_head_dim.
        kv_cache: (N, B, E) float32 / bfloat16 / float16 with E >= R + P (e.g. from
            :func:`host.allocate_mla_cache`), C-contiguous, writeable; updated in place, only
            elements [0, R + P) of the written entries change.
        slot_mapping: (T,) integer; slot = block * B + offset. Negative slots (padding) are
            skipped and touch nothing; every other slot must be < N * B and appear at most once.
        api: "legacy" | "nki" | None / "auto": the NKI API of the kernel (``host.cache.cache_ops``).
        lnc: physical cores of the launch, 1 | 2 | None (``host.cache.cache_ops``).

    Returns:
        ``kv_cache`` (the same object).

    Raises:
        ValueError: bad shapes / dtypes, an entry smaller than R + P, a slot >= N * B, repeated
            non-negative slots, a non-contiguous or read-only cache, an unknown ``api`` -- all
            before anything is written.
        NotImplementedError: an fp8 cache; N * B beyond the int32 index range.
    """
    run_api = resolve_kernel_api(api, lnc)
    cache = writable_array(kv_cache, "kv_cache")
    latent = check_float_array("kv_c", kv_c, ndim=2)
    rope = check_float_array("k_pe", k_pe, ndim=2)
    T, R = latent.shape
    if R < 1:
        fail("kv_c", "have kv_lora_rank = kv_c.shape[1] >= 1", f"shape {latent.shape}")
    if rope.shape[0] != T or rope.shape[1] < 1:
        fail("k_pe", f"have shape ({T}, qk_rope_head_dim >= 1) (one row per token of kv_c)",
             f"shape {rope.shape}")
    N, B, _ = check_mla_cache("kv_cache", cache, min_entry=R + rope.shape[1])
    slots = check_slot_mapping(slot_mapping, num_tokens=T, num_slots=N * B, tokens_arg="kv_c")
    check_int32_rows("num_blocks * block_size", N * B)
    if not (slots >= 0).any():
        return kv_cache  # nothing to write (also covers T == 0)

    from nki_kernels.cache.mla_cache_update import mla_cache_update

    latent_c = np.ascontiguousarray(latent.astype(cache.dtype, copy=False))
    rope_c = np.ascontiguousarray(rope.astype(cache.dtype, copy=False))
    row_index = mla_cache_write_row_index(slots, num_blocks=N, block_size=B)
    take_rows(cache.reshape(N * B, cache.shape[2]),
              run_api.run(mla_cache_update, latent_c, rope_c, cache, row_index), row_index)
    return kv_cache
