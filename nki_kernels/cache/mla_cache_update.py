"""MLA latent-cache write (vLLM ``concat_and_cache_mla``) as an NKI kernel: one indirect store per 128 tokens.

One source for both NKI APIs (the op layer, :mod:`nki_kernels.ops`): ``mla_cache_update.for_api(
api)`` is the jitted kernel of ``api`` ("legacy" | "nki"); calling the family runs the legacy one.
The cache is written in place on both APIs; the store is ``ops.scatter`` (legacy ``nl.arange``
index, current ``.ap(vector_offset=..., indirect_dim=0)``, both ``oob_mode.skip``).

Dimensions:
    T   new tokens;  R  kv_lora_rank (512 in DeepSeek V2/V3);  P  qk_rope_head_dim (64)
    E   allocated entry size, E >= R + P (E > R + P when the host pads entries for alignment)
    N   cache blocks;  B  block size

Layout (docs/layouts.md §12). The MLA cache is (N, B, E): one latent "KV head" shared by all
query heads, one entry of E elements per token slot. Entry s = block * B + offset holds
``[kv_c (R) | k_pe (P) | padding (E - R - P)]``. Viewed as (N * B, E) rows (a free reshape of a
C-contiguous HBM tensor), slot s IS row s, so the host's row index is the slot itself (negative
slots mapped out of bounds, see below).

One token's write is one contiguous run of R + P elements: the kernel loads the kv_c rows and the
k_pe rows of up to 128 tokens into ONE SBUF tile side by side (two direct DMAs into the two
column ranges of the tile, no engine copy), then stores each 128-token tile with ONE indirect DMA
whose rows are R + P elements wide -- one descriptor of (R + P) * itemsize bytes per token
(1152 B for bf16 576), never touching the padding columns [R + P, E). Stores: ceil(T / 128).

Negative slots (padding) are skipped: the host maps them to row N * B, which is out of bounds of
the indexed axis and of the flattened tensor (its first element would be N * B * E), and the
stores skip out-of-bounds rows (``oob_mode.skip``; legacy Neuron SDK >= 2.23).

Row order and chunking as in :mod:`nki_kernels.row_tiles` (bulk token q = p * n_tiles + t), so each
chunk's index / kv_c / k_pe loads read one contiguous run per partition.

DMA instructions of one core (n_tiles = T // 128, rem = T % 128, n_chunks = ceil(n_tiles /
chunk); on the current API at LNC 2 each core counts its ceil(T / 2) rows, ``row_tiles``):
    3 * n_chunks + n_tiles        bulk: index + kv_c + k_pe loads per chunk, 1 store per tile
    + 4 if rem > 0                tail tile: index, kv_c, k_pe loads and 1 store
    indirect stores = ceil(T / 128)

Pseudocode:
    kv_c (T, R), k_pe (T, P); cache_rows = kv_cache as (N * B, E)
    for each chunk of full tiles:                       # sequential_range
        idx[p, t]          = row_index[p * n_tiles + first + t]     # 1 DMA
        ent[p, t, 0:R]     = kv_c[p * n_tiles + first + t, :]       # 1 DMA
        ent[p, t, R:R+P]   = k_pe[p * n_tiles + first + t, :]       # 1 DMA
        for t in chunk:                                 # affine_range
            cache_rows[idx[p, t], 0:R+P] = ent[p, t, :]  (skip OOB)   # 1 indirect DMA, 128 rows
    tail tile (rem tokens): the same with token 128 * n_tiles + p
"""

from nki_kernels.contract import CACHE_WRITE_MAX_ROW_BYTES
from nki_kernels._assert import kernel_check, kernel_unsupported
from nki_kernels.ops import KernelFamily, dtype_name
from nki_kernels.row_tiles import PMAX, cache_itemsize, require_oob_skip, run_row_tiles


KERNEL = "mla_cache_update"
# Per-partition SBUF bytes for one chunk's entries + indices (as nki_kernels.cache.kv_cache_update).
CHUNK_BUDGET_BYTES = 32 * 1024
# Largest written entry part ((R + P) * itemsize) one partition holds.
MAX_ROW_BYTES = CACHE_WRITE_MAX_ROW_BYTES


def _build(ops):
    def mla_cache_update(kv_c, k_pe, kv_cache: ops.MUTABLE, row_index):
        """Scatter new tokens' [kv_c | k_pe] into the MLA cache through per-token rows; returns
        ``kv_cache``.

        Args:
            kv_c: (T, R) HBM, the new latent rows, same dtype as the cache (the host casts).
            k_pe: (T, P) HBM, the new rotary key parts, same dtype.
            kv_cache: (N, B, E) HBM, float32 / bfloat16 / float16, E >= R + P. Written in place;
                only elements [0, R + P) of an entry are written.
            row_index: (T, 1) int32 (or uint32) HBM; row_index[t, 0] is token t's row of the
                (N * B, E) view (its slot); a row >= N * B (the host uses N * B) is skipped.

        Returns:
            kv_cache (the written input, as the legacy API requires for a written parameter).

        Raises:
            ValueError: shapes / dtypes inconsistent, or E < R + P.
            NotImplementedError: unsupported cache dtype, (R + P) * itemsize > 16 KiB, or a
                legacy NKI toolchain older than Neuron SDK 2.23 (no ``nisa.oob_mode``).
        """
        kernel_check(len(kv_c.shape) == 2, KERNEL, "kv_c", "be 2-D (T, kv_lora_rank)",
                     tuple(kv_c.shape))
        n_tok, rank = kv_c.shape
        kernel_check(len(k_pe.shape) == 2 and k_pe.shape[0] == n_tok, KERNEL, "k_pe.shape",
                     f"be ({n_tok}, qk_rope_head_dim)", tuple(k_pe.shape))
        rope = k_pe.shape[1]
        width = rank + rope
        kernel_check(len(kv_cache.shape) == 3, KERNEL, "kv_cache.shape", "be (N, B, E)",
                     tuple(kv_cache.shape))
        n_blocks, block_size, entry = kv_cache.shape
        kernel_check(entry >= width, KERNEL, "kv_cache.shape[2] (entry size E)",
                     f"be >= kv_lora_rank + qk_rope_head_dim = {width}", entry)
        kernel_check(tuple(row_index.shape) == (n_tok, 1), KERNEL, "row_index.shape",
                     f"be ({n_tok}, 1)", tuple(row_index.shape))
        kernel_check(kv_c.dtype == kv_cache.dtype and k_pe.dtype == kv_cache.dtype, KERNEL,
                     "kv_c.dtype / k_pe.dtype", f"equal kv_cache.dtype {kv_cache.dtype}",
                     (str(kv_c.dtype), str(k_pe.dtype)))
        kernel_check(dtype_name(row_index.dtype) in ("int32", "uint32"), KERNEL,
                     "row_index.dtype", "be int32 or uint32", str(row_index.dtype))
        row_bytes = width * cache_itemsize(ops, kv_cache.dtype, KERNEL)
        kernel_unsupported(row_bytes <= MAX_ROW_BYTES, KERNEL, f"an entry of {width} written "
                           f"elements ({row_bytes} bytes)", f"keep (kv_lora_rank + "
                           f"qk_rope_head_dim) * itemsize <= {MAX_ROW_BYTES}")
        require_oob_skip(ops, KERNEL)

        cache_rows = kv_cache.reshape((n_blocks * block_size, entry))      # free view: slot = row
        ins = (kv_c, k_pe, row_index)
        run_row_tiles(ops, n_tok, row_bytes + 4, CHUNK_BUDGET_BYTES,
                      lambda first, n_tiles, n: _write_chunk(ops, ins, cache_rows, n_tiles, first,
                                                             n),
                      lambda start, n: _write_tail(ops, ins, cache_rows, start, n))
        return kv_cache

    return mla_cache_update


mla_cache_update = KernelFamily(_build, KERNEL)


def _write_chunk(ops, ins, cache_rows, n_tiles, first, n_chunk):
    """Tiles first .. first + n_chunk - 1 of the bulk tokens (token p * n_tiles + t on partition
    p)."""
    kv_c, k_pe, row_index = ins
    rank, rope = kv_c.shape[1], k_pe.shape[1]
    idx = ops.sbuf((PMAX, n_chunk, 1), row_index.dtype)                  # (128, n_chunk, 1) int32
    ops.load(idx, ops.row_block(row_index, first, n_tiles, PMAX, n_chunk))
    ent = ops.sbuf((PMAX, n_chunk, rank + rope), cache_rows.dtype)
    ops.dma(ent[:, :, 0:rank], ops.row_block(kv_c, first, n_tiles, PMAX, n_chunk))  # [0, R)
    ops.dma(ent[:, :, rank:rank + rope],
            ops.row_block(k_pe, first, n_tiles, PMAX, n_chunk))                     # [R, R + P)
    for t in ops.parallel_range(n_chunk):
        ops.scatter(cache_rows, idx[:, t, :], 0, ent[:, t, :])


def _write_tail(ops, ins, cache_rows, start, n):
    """The last T % 128 tokens, start + p on partition p."""
    kv_c, k_pe, row_index = ins
    rank, rope = kv_c.shape[1], k_pe.shape[1]
    idx = ops.sbuf((n, 1), row_index.dtype)                              # (n, 1) int32
    ops.load(idx, ops.rows(row_index, start, n))
    ent = ops.sbuf((n, rank + rope), cache_rows.dtype)
    ops.dma(ent[:, 0:rank], ops.rows(kv_c, start, n))
    ops.dma(ent[:, rank:rank + rope], ops.rows(k_pe, start, n))
    ops.scatter(cache_rows, idx, 0, ent)
