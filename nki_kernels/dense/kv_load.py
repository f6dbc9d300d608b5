"""The vectorized KV-tile load: one indirect DMA per 128 gathered rows, for K and for V.

Device code on the op layer (:mod:`nki_kernels.ops`; every function takes it first). This is
the function a per-block baseline replaces: anything that returns the same ``(k_tile, v_tile)``
layout for a large tile can be swapped in.

Dimensions:
    d      head size (<= 128)                  LT   LARGE_TILE_SZ (tokens per large tile)
    B      block_size                          M    LT // B blocks per tile
    T      128 // M if M < 128 else 1          b'   B // T tokens per gathered row
    nL     max(M, 128) // 128 indirect loads per tile

Token order ("permuted order", docs/layouts.md): partition p of load l gathers row
``q = l*128 + p`` = tokens ``[q*b', (q+1)*b')`` of the tile, i.e. sub-block ``q % T`` of the
tile's block ``q // T``. Column ``c = l*128*b' + s*128 + p`` of ``k_tile`` (and V chunk
``c // 128`` at partition ``c % 128``) therefore holds tile-local token
``tau(c) = l*128*b' + p*b' + s`` (s < b'). The host's ``reorder_context_mask`` puts mask
column c on the same token; for b' == 1 the order is the natural one.
"""

from __future__ import annotations

from nki_kernels.constants import B_P_SIZE
from nki_kernels.dense.finite import finite_key_rows
from nki_kernels.ops import dtype_name
from nki_kernels.tile_ops import transpose_blocks


def flat_kv_view(kv_cache, *, tiling_factor):
    """HBM view ``(2, N*Hkv*T, b'*d)`` of ``kv_cache (2, N, Hkv, B, d)``: one row = b' tokens
    of one (block, head, sub-block); row id ``(blk*Hkv + head)*T + t`` (no data movement)."""
    _, N, Hkv, B, d = kv_cache.shape
    T = tiling_factor
    return kv_cache.reshape((2, N * Hkv * T, (B // T) * d))


def load_kv_tile(ops, kv_flat, block_rows, tile_idx, *, n_loads, tiled_block_size, head_size,
                 kernel_dtype):
    """Gather the K and V of large tile ``tile_idx`` for one KV head.

    Args:
        ops: the op layer.
        kv_flat: HBM ``(2, N*Hkv*T, b'*d)`` (see :func:`flat_kv_view`), cache dtype.
        block_rows: SBUF int32 ``(128, nL * n_tiles)`` from
            ``nki_kernels.dense.block_tables.load_block_tables`` (rows of ``kv_flat``; column
            ``l*n_tiles + j`` for load l of tile j).
        tile_idx: large-tile index j (int or loop variable).
        n_loads: nL.  tiled_block_size: b'.  head_size: d.
        kernel_dtype: dtype of the returned tiles (bf16 in mixed precision).

    Returns:
        ``(k_tile, v_tile)`` SBUF tiles in ``kernel_dtype``:
        ``k_tile (d, LT)``: column c holds the key of tile-local token tau(c) (module docstring);
        ``v_tile (128, LT//128 * d)``: columns ``[k*d, (k+1)*d)`` at partition p hold the value of
        the token of K column ``k*128 + p`` -- chunk k is the V operand for P^T chunk k.

    DMA shape (what the trace test asserts): nL indirect loads for K and nL for V, each
    gathering 128 rows of ``b'*d`` contiguous cache elements (128 descriptors of
    ``b'*d*itemsize`` bytes).

    Pseudocode:
        for l < nL:
            X = gather kv_flat[0, block_rows[:, l*n_tiles + j], :]    (128, b'*d)  [cast to kernel dtype]
            V[:, l*b'*d : (l+1)*b'*d] = gather kv_flat[1, same rows, :]  [cast]
            for s < b': K[:, l*128*b' + s*128 : +128] = X[:, s*d:(s+1)*d].T   (PE transposes)
    """
    bp, d = tiled_block_size, head_size
    n_tiles = block_rows.shape[1] // n_loads
    row_w = bp * d
    k_tile = ops.sbuf((d, n_loads * B_P_SIZE * bp), kernel_dtype)
    v_tile = ops.sbuf((B_P_SIZE, n_loads * row_w), kernel_dtype)
    same = dtype_name(kv_flat.dtype) == dtype_name(kernel_dtype)
    for l in ops.parallel_range(n_loads):
        col = l * n_tiles + tile_idx
        if same:
            ops.gather_rows(v_tile[:, ops.ds(l * row_w, row_w)], kv_flat[1], block_rows, col)
        else:
            _gather_cast(ops, v_tile[:, ops.ds(l * row_w, row_w)], kv_flat, 1, block_rows, col)
        k_rows = ops.sbuf((B_P_SIZE, row_w), kernel_dtype)
        _gather_cast(ops, k_rows, kv_flat, 0, block_rows, col)
        transpose_keys(ops, k_tile, l, k_rows, v_tile, tiled_block_size=bp, head_size=d)
    return k_tile, v_tile


def transpose_keys(ops, k_tile, load, k_rows, v_tile, *, tiled_block_size, head_size):
    """K rows of load ``load`` (SBUF ``(128, b'*d)``) into ``k_tile``'s columns ``[load*128*b',
    (load+1)*128*b')`` by PE transposes; on NeuronCore-v2, whose transposes spread a non-finite
    element along its transposed row, the non-finite key rows are zeroed first and their fault
    moved into ``v_tile``'s rows of the same keys (``finite.finite_key_rows``)."""
    bp, d = tiled_block_size, head_size
    if ops.nc_gen() == "gen2":
        finite_key_rows(ops, k_rows, v_tile, load * bp * d, head_size=d)
    transpose_blocks(ops, k_tile, load * B_P_SIZE * bp, k_rows, 0, d, bp, evac="scalar")


def _gather_cast(ops, dst, kv_flat, kv, block_rows, col):
    """Indirect gather of 128 rows of K (kv=0) or V (kv=1) into ``dst`` (128, b'*d): in the
    cache dtype -- no dtype conversion inside an indirect DMA, as AWS's kernels do -- then
    converted on chip (on ScalarE) if ``dst``'s dtype differs (the staging tile dies on return)."""
    if dtype_name(kv_flat.dtype) == dtype_name(dst.dtype):
        ops.gather_rows(dst, kv_flat[kv], block_rows, col)
        return
    rows = ops.sbuf(tuple(dst.shape), kv_flat.dtype)
    ops.gather_rows(rows, kv_flat[kv], block_rows, col)
    # SBUF -> SBUF float conversion on ScalarE (less loaded than VectorE; GpSimd would compete
    # with the software-DGE descriptor generation of the next gather, and on trn1 it would also
    # stall VectorE's SBUF access).
    ops.copy(dst, rows, engine="scalar")
