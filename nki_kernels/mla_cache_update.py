"""MLA latent-cache write (vLLM ``concat_and_cache_mla``) as an NKI kernel: one indirect store per 128 tokens.

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
stores use ``nisa.dma_copy(..., oob_mode=nisa.oob_mode.skip)`` (Neuron SDK >= 2.23).

Row order and chunking as in :mod:`nki_kernels.row_tiles` (bulk token q = p * n_tiles + t), so each
chunk's index / kv_c / k_pe loads read one contiguous run per partition.

DMA instructions (n_tiles = T // 128, rem = T % 128, n_chunks = ceil(n_tiles / chunk)):
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

from nki_kernels._assert import kernel_check, kernel_unsupported
from nki_kernels._nki import nki, nisa, nl, nt
from nki_kernels.row_tiles import PMAX, cache_itemsize, plan_rows, require_oob_skip


KERNEL = "mla_cache_update"
# Per-partition SBUF bytes for one chunk's entries + indices (as nki_kernels.kv_cache_update).
CHUNK_BUDGET_BYTES = 32 * 1024
# Largest written entry part ((R + P) * itemsize) one partition holds.
MAX_ROW_BYTES = 16 * 1024


@nki.jit
def mla_cache_update(kv_c, k_pe, kv_cache: nt.mutable_tensor, row_index):
    """Scatter new tokens' [kv_c | k_pe] into the MLA cache through per-token rows; returns ``kv_cache``.

    Args:
        kv_c: (T, R) HBM, the new latent rows, same dtype as the cache (the host casts).
        k_pe: (T, P) HBM, the new rotary key parts, same dtype.
        kv_cache: (N, B, E) HBM, mutable, float32 / bfloat16 / float16, E >= R + P. Written in
            place; only elements [0, R + P) of an entry are written.
        row_index: (T, 1) int32 (or uint32) HBM; row_index[t, 0] is token t's row of the
            (N * B, E) view (its slot); a row >= N * B (the host uses N * B) is skipped.

    Returns:
        kv_cache (the mutable input, as NKI requires for a written parameter).

    Raises:
        ValueError: shapes / dtypes inconsistent, or E < R + P.
        NotImplementedError: unsupported cache dtype, (R + P) * itemsize > 16 KiB, or an NKI
            toolchain older than Neuron SDK 2.23 (no ``nisa.oob_mode``).
    """
    kernel_check(len(kv_c.shape) == 2, KERNEL, "kv_c", "be 2-D (T, kv_lora_rank)", tuple(kv_c.shape))
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
    kernel_check(row_index.dtype == nl.int32 or row_index.dtype == nl.uint32, KERNEL,
                 "row_index.dtype", "be int32 or uint32", str(row_index.dtype))
    row_bytes = width * cache_itemsize(kv_cache.dtype, KERNEL)
    kernel_unsupported(row_bytes <= MAX_ROW_BYTES, KERNEL, f"an entry of {width} written elements "
                       f"({row_bytes} bytes)", f"keep (kv_lora_rank + qk_rope_head_dim) * itemsize "
                       f"<= {MAX_ROW_BYTES}")
    require_oob_skip(KERNEL)

    cache_rows = kv_cache.reshape((n_blocks * block_size, entry))      # free view: slot = row
    plan = plan_rows(n_tok, row_bytes + 4, CHUNK_BUDGET_BYTES)
    # sequential over chunks: the scatter destinations are data-dependent and do not mention c
    # (same reasoning as nki_kernels.kv_cache_update); tiles of a chunk are affine.
    for c in nl.sequential_range(plan.n_full_chunks):
        _write_chunk(kv_c, k_pe, cache_rows, row_index, plan.n_tiles, c * plan.chunk, plan.chunk)
    if plan.last_chunk > 0:
        _write_chunk(kv_c, k_pe, cache_rows, row_index, plan.n_tiles,
                     plan.n_full_chunks * plan.chunk, plan.last_chunk)
    if plan.rem > 0:
        _write_tail(kv_c, k_pe, cache_rows, row_index, plan.n_tiles * PMAX, plan.rem)
    return kv_cache


def _write_chunk(kv_c, k_pe, cache_rows, row_index, n_tiles, first, n_chunk):
    """Tiles first .. first + n_chunk - 1 of the bulk tokens (token p * n_tiles + t on partition p)."""
    rank, rope = kv_c.shape[1], k_pe.shape[1]
    i_p = nl.arange(PMAX)[:, None, None]
    i_t = nl.arange(n_chunk)[None, :, None]
    i_r = nl.arange(rank)[None, None, :]
    i_e = nl.arange(rope)[None, None, :]
    i_0 = nl.arange(1)[None, None, :]
    src_row = i_p * n_tiles + first + i_t
    idx = nl.load(row_index[src_row, i_0])                          # (128, n_chunk, 1) int32
    ent = nl.ndarray((PMAX, n_chunk, rank + rope), dtype=cache_rows.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ent[i_p, i_t, i_r], src=kv_c[src_row, i_r])         # columns [0, R)
    nisa.dma_copy(dst=ent[i_p, i_t, rank + i_e], src=k_pe[src_row, i_e])  # columns [R, R + P)

    j_p = nl.arange(PMAX)[:, None]
    j_f = nl.arange(rank + rope)[None, :]
    for t in nl.affine_range(n_chunk):
        nisa.dma_copy(dst=cache_rows[idx[j_p, t, 0], j_f], src=ent[j_p, t, j_f],
                      oob_mode=nisa.oob_mode.skip)


def _write_tail(kv_c, k_pe, cache_rows, row_index, start, n):
    """The last T % 128 tokens, start + p on partition p."""
    rank, rope = kv_c.shape[1], k_pe.shape[1]
    i_p = nl.arange(n)[:, None]
    i_r = nl.arange(rank)[None, :]
    i_e = nl.arange(rope)[None, :]
    i_f = nl.arange(rank + rope)[None, :]
    i_0 = nl.arange(1)[None, :]
    idx = nl.load(row_index[start + i_p, i_0])                      # (n, 1) int32
    ent = nl.ndarray((n, rank + rope), dtype=cache_rows.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ent[i_p, i_r], src=kv_c[start + i_p, i_r])
    nisa.dma_copy(dst=ent[i_p, rank + i_e], src=k_pe[start + i_p, i_e])
    nisa.dma_copy(dst=cache_rows[idx[i_p, 0], i_f], src=ent[i_p, i_f], oob_mode=nisa.oob_mode.skip)
