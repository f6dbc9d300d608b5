"""Coalesced KV-cache block copy as NKI kernels: indirect gather + scatter, 128 rows per DMA.

One source for both NKI APIs (the op layer, :mod:`nki_kernels.ops`): ``copy_cache_blocks.for_api(
api)`` / ``swap_cache_blocks.for_api(api)`` are the jitted kernels of ``api`` ("legacy" | "nki");
calling a family runs the legacy one. The destination cache is written in place on both APIs.
Gathers and scatters are ``ops.gather`` / ``ops.scatter`` (legacy: ``nl.arange`` index
expressions; current: ``.ap(..., vector_offset=<(128, 1) index column>, indirect_dim=0)``); every
index is in range (host-validated), so the out-of-bounds skip they carry never fires.

Dimensions:
    L   layers;  N  blocks per layer (Ns / Nd for the source / destination cache of a swap)
    S   = Hkv * B * d elements of one (layer, kv, block) slab, contiguous in (2, N, Hkv, B, d)
        (an MLA latent cache (N, B, E) arrives as (1, N, 1, B, E): one "half", S = B * E)
    F   row length: S is split into n_sub = S // F contiguous rows of F elements so that one
        row fits a partition budget (the host picks F, a divisor of S, F * itemsize <= 16 KiB)
    M   rows to copy = L * 2 * n_blocks_copied * n_sub

The host hands the kernel all layers as ONE (L, 2, N, Hkv, B, d) tensor (free when the layers live
in one contiguous buffer), the row length F as a compile-time argument and an index (M, 2) int32
of [source row, destination row]; the kernel views the cache as (R, F) rows, R = L * 2 * N * n_sub
(a free reshape of an HBM tensor). Row (l, kv, blk, j) is ((l * 2 + kv) * N + blk) * n_sub + j.
Because every row carries its own source and destination, rows of all layers, both K and V,
all blocks and all "groups" of the block mapping share DMAs: 128 rows per gather and per
scatter, 2 * ceil(M / 128) indirect DMAs in one launch, instead of one DMA (pair) per block or
per group per layer.

Correctness needs no ordering between tiles because the host guarantees that no row is both a
source and a destination (src / dst block overlap is rejected) and destinations are unique, so
every gather reads original data and no two scatters hit the same row. The tiles are therefore
independent: tiles of a chunk use ``ops.parallel_range`` (the scatter index subscript carries the loop
variable); the chunk loop is ``ops.sequential_range`` because its scatter destinations do not mention
the chunk variable (NKI's affine output-dependency rule cannot see through the index data).

Row order and chunking as in :mod:`nki_kernels.row_tiles`: bulk row q = p * n_tiles + t;
one direct DMA loads the [src, dst] indices of a whole chunk of tiles.

DMA instructions of one core (n_tiles = M // 128, rem = M % 128, n_chunks = ceil(n_tiles /
chunk); on the current API at LNC 2 each core counts its ceil(M / 2) rows, ``row_tiles``):
    n_chunks + 2 * n_tiles          index load per chunk; gather + scatter per tile
    + 3 if rem > 0                  tail: index load, gather, scatter
    indirect (gather + scatter) = 2 * ceil(M / 128); payload bytes = 2 * M * F * itemsize

Pseudocode:
    for each chunk:                                   # sequential_range
        idx[p, t, :] = index[p * n_tiles + first + t, :]      # 1 DMA
        for t in chunk:                               # affine_range
            tile[p, :] = src_rows[idx[p, t, 0], :]             # 1 indirect gather, 128 rows
            dst_rows[idx[p, t, 1], :] = tile[p, :]             # 1 indirect scatter, 128 rows
    tail tile: the same for rows 128 * n_tiles + p
"""

from nki_kernels._assert import kernel_check, kernel_unsupported
from nki_kernels.ops import KernelFamily, dtype_name
from nki_kernels.row_tiles import PMAX, cache_itemsize, run_row_tiles


# Largest row a partition holds (F * itemsize); >= 4 KiB per partition already saturates DMA.
MAX_ROW_BYTES = 32 * 1024
# Per-partition bytes for one chunk of [src, dst] int32 indices (8 bytes per tile).
INDEX_CHUNK_BUDGET_BYTES = 8 * 1024


def _build_copy(ops):
    def copy_cache_blocks(kv_caches: ops.MUTABLE, row_pairs, row_elems=0):
        """Copy rows inside all layers' caches: rows[dst] = rows[src]; returns ``kv_caches``.

        Args:
            kv_caches: (L, 2, N, Hkv, B, d) HBM, float32 / bfloat16 / float16 (or fp8 bytes):
                every layer's cache in one tensor; or (L, 1, N, 1, B, E), MLA latent caches
                (N, B, E) (one "half"). Viewed as (L*halves*N*n_sub, F) rows, F = row_elems,
                n_sub = Hkv*B*d // F. Written in place.
            row_pairs: (M, 2) int32 HBM, [source row, destination row] of that view; all rows in
                range, destinations unique, no source row is also a destination (host-validated).
            row_elems: F (compile-time int), a divisor of Hkv*B*d.

        Returns:
            kv_caches, written in place.
        """
        name = "copy_cache_blocks"
        kernel_check(len(kv_caches.shape) == 6 and kv_caches.shape[1] in (1, 2), name,
                     "kv_caches.shape", "be (L, 2, N, Hkv, B, d) or (L, 1, N, 1, B, E)",
                     tuple(kv_caches.shape))
        rows = _row_view(name, kv_caches, row_elems)
        _check(ops, name, rows, rows, row_pairs)
        _copy_rows(ops, rows, rows, row_pairs)
        return kv_caches

    return copy_cache_blocks


def _build_swap(ops):
    def swap_cache_blocks(src_cache, dst_cache: ops.MUTABLE, row_pairs, row_elems=0):
        """Copy rows between two caches: dst rows[dst] = src rows[src]; returns ``dst_cache``.

        Args:
            src_cache: (2, Ns, Hkv, B, d) HBM, the source cache (read only); or (1, Ns, 1, B, E),
                an MLA latent cache (Ns, B, E).
            dst_cache: (2 or 1, Nd, Hkv, B, d) HBM, same halves, (Hkv, B, d) and dtype. Written
                in place.
            row_pairs: (M, 2) int32 HBM, [row of src view, row of dst view] of the
                (halves*N*n_sub, F) row views; destinations unique (host-validated).
            row_elems: F (compile-time int), a divisor of Hkv*B*d.

        Returns:
            dst_cache, written in place.
        """
        name = "swap_cache_blocks"
        for arg, t in (("src_cache", src_cache), ("dst_cache", dst_cache)):
            kernel_check(len(t.shape) == 5 and t.shape[0] in (1, 2), name, f"{arg}.shape",
                         "be (2, N, Hkv, B, d) or (1, N, 1, B, E)", tuple(t.shape))
        kernel_check(src_cache.shape[0] == dst_cache.shape[0], name, "dst_cache.shape[0]",
                     f"equal src_cache.shape[0] {src_cache.shape[0]}", dst_cache.shape[0])
        kernel_check(tuple(src_cache.shape[2:]) == tuple(dst_cache.shape[2:]), name,
                     "dst_cache.shape[2:]", f"equal src_cache.shape[2:] {tuple(src_cache.shape[2:])}",
                     tuple(dst_cache.shape[2:]))
        src_rows = _row_view(name, src_cache, row_elems)
        dst_rows = _row_view(name, dst_cache, row_elems)
        _check(ops, name, src_rows, dst_rows, row_pairs)
        _copy_rows(ops, src_rows, dst_rows, row_pairs)
        return dst_cache

    return swap_cache_blocks


copy_cache_blocks = KernelFamily(_build_copy, "copy_cache_blocks")
swap_cache_blocks = KernelFamily(_build_swap, "swap_cache_blocks")


def _row_view(name, cache, row_elems):
    """(..., Hkv, B, d) cache -> (size // F, F) rows; F must divide the (Hkv, B, d) slab."""
    slab = cache.shape[-3] * cache.shape[-2] * cache.shape[-1]
    kernel_check(isinstance(row_elems, int) and row_elems > 0 and slab % row_elems == 0, name,
                 "row_elems", f"be a positive divisor of Hkv*B*d = {slab}", row_elems)
    n_slabs = 1
    for size in cache.shape[:-3]:
        n_slabs *= size
    return cache.reshape((n_slabs * (slab // row_elems), row_elems))


def _check(ops, name, src_rows, dst_rows, row_pairs):
    kernel_check(src_rows.dtype == dst_rows.dtype, name, "destination dtype",
                 f"equal the source dtype {src_rows.dtype}", str(dst_rows.dtype))
    kernel_check(len(row_pairs.shape) == 2 and row_pairs.shape[1] == 2, name, "row_pairs.shape",
                 "be (M, 2)", tuple(row_pairs.shape))
    kernel_check(dtype_name(row_pairs.dtype) in ("int32", "uint32"), name, "row_pairs.dtype",
                 "be int32 or uint32", str(row_pairs.dtype))
    row_bytes = src_rows.shape[1] * cache_itemsize(ops, src_rows.dtype, name)
    kernel_unsupported(row_bytes <= MAX_ROW_BYTES, name, f"rows of {row_bytes} bytes",
                       f"pass row_elems with row_elems * itemsize <= {MAX_ROW_BYTES}")


def _copy_rows(ops, src_rows, dst_rows, row_pairs):
    """Gather rows of ``src_rows`` and scatter them into ``dst_rows``, 128 rows per DMA."""
    run_row_tiles(ops, row_pairs.shape[0], 8, INDEX_CHUNK_BUDGET_BYTES,
                  lambda first, n_tiles, n: _copy_chunk(ops, src_rows, dst_rows, row_pairs,
                                                        n_tiles, first, n),
                  lambda start, n: _copy_tail(ops, src_rows, dst_rows, row_pairs, start, n))


def _copy_chunk(ops, src_rows, dst_rows, row_pairs, n_tiles, first, n_chunk):
    """Tiles first .. first + n_chunk - 1 (pair p * n_tiles + t on partition p)."""
    idx = ops.sbuf((PMAX, n_chunk, 2), row_pairs.dtype)            # (128, n_chunk, 2) int32
    ops.load(idx, ops.row_block(row_pairs, first, n_tiles, PMAX, n_chunk))
    for t in ops.parallel_range(n_chunk):
        pair = idx[:, t, :]
        rows = ops.sbuf((PMAX, src_rows.shape[1]), src_rows.dtype)
        ops.gather_rows(rows, src_rows, pair, 0)                    # gather 128 rows
        ops.scatter_rows(dst_rows, pair, 1, rows)                   # scatter 128 rows


def _copy_tail(ops, src_rows, dst_rows, row_pairs, start, n):
    """The last M % 128 pairs, start + p on partition p."""
    idx = ops.sbuf((n, 2), row_pairs.dtype)                        # (n, 2) int32
    ops.load(idx, ops.rows(row_pairs, start, n))
    rows = ops.sbuf((n, src_rows.shape[1]), src_rows.dtype)
    ops.gather_rows(rows, src_rows, idx, 0)
    ops.scatter_rows(dst_rows, idx, 1, rows)
