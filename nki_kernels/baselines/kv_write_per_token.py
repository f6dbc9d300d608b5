"""Benchmark-only baseline: the KV-cache write with one DMA (per kind) per TOKEN.

Same inputs and result as :func:`nki_kernels.cache.kv_cache_update.kv_cache_update`, but each token's
Hkv (token, head) rows travel in their own DMAs: per token one index load, one K load, one V load
and two indirect stores of Hkv rows each -- 5 * T DMA instructions (2 * T indirect) instead of
about 2 * ceil(T * Hkv / 128) indirect ones. Negative slots are skipped the same way
(row index 2 * NHB with ``oob_mode.skip``). Used by ``scripts/bench_cache_write.py``.
Legacy API only (a benchmark baseline, not a product kernel).

Args (HBM):
    key, value: (T, Hkv, d), the cache dtype.
    kv_cache: (2, N, Hkv, B, d), mutable; viewed as (2, N*Hkv*B, d) rows in the kernel.
    row_index: (T, Hkv, 1) int32, destination row of (token, head) (``host.cache.cache_ops.cache_write_row_index``
        reshaped to (T, Hkv, 1)).
"""

from nki_kernels._assert import kernel_check
from nki_kernels.toolchain import nki, nisa, nl, nt
from nki_kernels.ops import legacy as legacy_ops
from nki_kernels.row_tiles import require_oob_skip


@nki.jit
def kv_write_per_token(key, value, kv_cache: nt.mutable_tensor, row_index):
    """Write K / V token by token; returns ``kv_cache``."""
    name = "kv_write_per_token"
    kernel_check(len(key.shape) == 3 and tuple(value.shape) == tuple(key.shape), name, "key/value",
                 "be (T, Hkv, d) of equal shape", (tuple(key.shape), tuple(value.shape)))
    n_tok, n_heads, d = key.shape
    kernel_check(n_heads <= 128, name, "Hkv", "be <= 128", n_heads)
    kernel_check(tuple(row_index.shape) == (n_tok, n_heads, 1), name, "row_index.shape",
                 f"be {(n_tok, n_heads, 1)}", tuple(row_index.shape))
    kernel_check(len(kv_cache.shape) == 5, name, "kv_cache", "be (2, N, Hkv, B, d)", tuple(kv_cache.shape))
    require_oob_skip(legacy_ops, name)
    cache_rows = kv_cache.reshape((2, kv_cache.shape[1] * kv_cache.shape[2] * kv_cache.shape[3], d))
    i_h = nl.arange(n_heads)[:, None]
    i_f = nl.arange(d)[None, :]
    i_0 = nl.arange(1)[None, :]
    # sequential: each token's scatter destination comes from a fresh index tile whose subscript does
    # not mention t (see err_unexpected_output_dependencies); DMA counts are unaffected.
    for t in nl.sequential_range(n_tok):
        idx = nl.load(row_index[t, i_h, i_0])       # (Hkv, 1) int32
        k = nl.load(key[t, i_h, i_f])                     # (Hkv, d)
        v = nl.load(value[t, i_h, i_f])
        nisa.dma_copy(dst=cache_rows[0, idx[i_h, 0], i_f], src=k[i_h, i_f], oob_mode=nisa.oob_mode.skip)
        nisa.dma_copy(dst=cache_rows[1, idx[i_h, 0], i_f], src=v[i_h, i_f], oob_mode=nisa.oob_mode.skip)
    return kv_cache
