"""Benchmark-only baseline: block copy with one gather + one scatter DMA per caller-defined BATCH.

``scripts/bench_block_copy.py`` uses it to model the uncoalesced strategies on the same row view
and row pairs as :func:`nki_kernels.cache.block_copy.copy_cache_blocks`:

* per-block: one batch per (layer, block) -- that block's K and V rows;
* per-group: one batch per (layer, group) -- the rows of a contiguous run of blocks.

Each batch (<= 128 rows) costs one index load, one indirect gather and one indirect scatter, so
the instruction count follows the batching while the payload bytes stay those of the coalesced
kernel. Batches are consecutive spans of ``row_pairs``; their sizes are a compile-time tuple.

Args (HBM):
    kv_caches: (L, 2, N, Hkv, B, d) mutable, fp32 / bf16 / fp16: all layers' caches.
    row_pairs: (M, 2) int32 [source row, destination row] of the (L*2*N*n_sub, F) row view.
    row_elems: F (compile-time int), a divisor of Hkv*B*d.
    batch_sizes: tuple of ints in [1, 128] summing to M (compile-time constant).
"""

from nki_kernels._assert import kernel_check
from nki_kernels.toolchain import nki, nl, nt



@nki.jit
def copy_rows_batched(kv_caches: nt.mutable_tensor, row_pairs, row_elems=0, batch_sizes=()):
    """rows[dst] = rows[src], one gather / scatter pair per batch; returns ``kv_caches``."""
    name = "copy_rows_batched"
    slab = kv_caches.shape[3] * kv_caches.shape[4] * kv_caches.shape[5]
    kernel_check(len(kv_caches.shape) == 6 and row_elems > 0 and slab % row_elems == 0, name,
                 "row_elems", f"divide Hkv*B*d = {slab}", row_elems)
    n_rows = kv_caches.shape[0] * 2 * kv_caches.shape[2] * (slab // row_elems)
    cache_rows = kv_caches.reshape((n_rows, row_elems))
    sizes = tuple(int(s) for s in batch_sizes)
    kernel_check(all(1 <= s <= 128 for s in sizes) and sum(sizes) == row_pairs.shape[0], name,
                 "batch_sizes", f"be sizes in [1, 128] summing to {row_pairs.shape[0]}", sizes)
    f = cache_rows.shape[1]
    i_f = nl.arange(f)[None, :]
    i_c = nl.arange(2)[None, :]
    start = 0
    for size in sizes:                       # trace-time unrolled: batch shapes differ
        i_p = nl.arange(size)[:, None]
        idx = nl.load(row_pairs[start + i_p, i_c])
        rows = nl.load(cache_rows[idx[i_p, 0], i_f])
        nl.store(cache_rows[idx[i_p, 1], i_f], value=rows)
        start += size
    return kv_caches
