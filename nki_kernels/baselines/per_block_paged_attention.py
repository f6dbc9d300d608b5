"""Per-block baseline of flash paged attention: one DMA per (KV block, K or V).

BENCHMARK BASELINE ONLY (used by scripts/bench_paged_attention.py); not part of the product API.
Device code (legacy NKI), launched like the product kernel on the grid ``[1, Hkv]``.

What it models: the KV-cache load of the kernel before vLLM PR #13245 ("Vectorize KV cache load
in FlashPagedAttention to maximize DMA bandwidth"), where every context block was fetched by its
own DMA whose source address came from the block table in SBUF. Everything else is the product
kernel (``nki_kernels.dense.flash_paged_attention``) unchanged: only the KV-tile loader is swapped.

Design (kept deliberately favourable to the baseline, so the benchmark isolates one effect):
    The product loader gathers 128 rows of ``b'*d`` contiguous cache elements per indirect DMA
    (``nki_kernels.dense.kv_load.load_kv_tile``). Row ``q = m*T + t`` of a large tile is sub-block t of
    the tile's block m (T = tiling factor, b' = block_size // T). This baseline issues ONE
    indirect DMA per block and per K/V, gathering that block's T rows (T partitions of
    ``b'*d*itemsize`` bytes, i.e. the whole block) into the same partitions of the same SBUF
    tiles, followed by exactly the product's on-chip K transposes. Result: identical SBUF
    layout, identical descriptor sizes and bytes, but ``M = LARGE_TILE_SZ // block_size``
    DMA instructions per large tile for K and M for V, instead of ``max(M, 128) // 128`` each.
    The original pre-#13245 kernel was worse still: it loaded each block as ``block_size``
    partitions of ``d`` elements (256 B descriptors for bf16, d = 128) and transposed K block by
    block; that variant needs a different SBUF layout and is not reproduced here.

Dimensions: as in ``nki_kernels.dense.kv_load`` (d, LT, B, M, T, b', nL).
"""

from __future__ import annotations

import numpy as np

import functools

from nki_kernels.toolchain import nki, nisa, nl
from nki_kernels.constants import B_P_SIZE, tile_geometry
from nki_kernels.dense.flash_paged_attention import flash_paged_attention_body, output_shape
from nki_kernels.dense.kv_load import transpose_keys
from nki_kernels.ops import legacy as legacy_ops


@nki.jit
def per_block_paged_attention(query, key, value, kv_cache, block_tables, mask, softmax_scale=None,
                              mixed_precision=True, LARGE_TILE_SZ=2048):
    """Same interface, grid ``[1, Hkv]`` and result as ``flash_paged_attention``; the KV tiles are
    loaded by :func:`load_kv_tile_per_block` (one DMA per block for K and one for V).

    Input validation is the product kernel's (it runs inside ``flash_paged_attention_body``);
    the geometry below only reads shapes, so a bad input still gets the product's ValueError.
    """
    block_size = kv_cache.shape[3] if len(kv_cache.shape) == 5 else 1
    tiling_factor = 1
    if isinstance(LARGE_TILE_SZ, int) and LARGE_TILE_SZ >= block_size > 0:
        tiling_factor = tile_geometry(block_size, LARGE_TILE_SZ)[1]
    loader = functools.partial(load_kv_tile_per_block, tiling_factor=tiling_factor)
    o = nl.ndarray(output_shape(query), dtype=query.dtype, buffer=nl.shared_hbm)
    return flash_paged_attention_body(legacy_ops, query, key, value, kv_cache, block_tables, mask,
                                      softmax_scale=softmax_scale,
                                      mixed_precision=mixed_precision,
                                      LARGE_TILE_SZ=LARGE_TILE_SZ, out=o, load_kv=loader)


def load_kv_tile_per_block(ops, kv_flat, block_rows, tile_idx, *, n_loads, tiled_block_size,
                           head_size, kernel_dtype, tiling_factor):
    """Drop-in replacement of ``load_kv_tile`` issuing one DMA per (block, K or V).

    Args:
        ops: the op layer (the legacy one: this baseline is legacy-API code).
        kv_flat: HBM ``(2, N*Hkv*T, b'*d)`` (``nki_kernels.dense.kv_load.flat_kv_view``).
        block_rows: SBUF int32 ``(128, nL * n_tiles)`` from ``load_block_tables``; partitions
            ``[m*T, (m+1)*T)`` of column ``l*n_tiles + j`` hold the T rows of block
            ``l*(128//T) + m`` of tile j.
        tile_idx: large-tile index j.
        n_loads: nL.  tiled_block_size: b'.  head_size: d.  kernel_dtype: dtype of the
            returned tiles.
        tiling_factor: T (rows per block; 128 // T blocks per 128-row load).

    Returns:
        ``(k_tile (d, LT), v_tile (128, LT//128 * d))``, bit-identical to ``load_kv_tile``.

    Pseudocode:
        for l < nL:
            for m < 128 // T:                       # one K DMA and one V DMA per block
                Krows[m*T : (m+1)*T, :] = gather kv_flat[0, block_rows[m*T : (m+1)*T, l*n_tiles + j], :]
                V[m*T : (m+1)*T, l*b'*d : (l+1)*b'*d] = gather kv_flat[1, same rows, :]
            for s < b': K[:, l*128*b' + s*128 : +128] = Krows[:, s*d:(s+1)*d].T   (PE)
    """
    bp, d, T = tiled_block_size, head_size, tiling_factor
    n_tiles = block_rows.shape[1] // n_loads
    row_w = bp * d
    blocks_per_load = B_P_SIZE // T
    k_tile = nl.ndarray((d, n_loads * B_P_SIZE * bp), dtype=kernel_dtype, buffer=nl.sbuf)
    v_tile = nl.ndarray((B_P_SIZE, n_loads * row_w), dtype=kernel_dtype, buffer=nl.sbuf)
    i_t = nl.arange(T)[:, None]
    i_f = nl.arange(row_w)[None, :]
    convert = np.dtype(kv_flat.dtype) != np.dtype(kernel_dtype)
    for l in nl.affine_range(n_loads):
        # Gathers land in cache-dtype staging tiles (no dtype conversion inside an indirect DMA,
        # as in the product loader); whole 128-row tiles are converted on ScalarE afterwards.
        # Same dtypes (the benchmarked bf16 case): V lands directly in v_tile, as in the product.
        k_rows = nl.ndarray((B_P_SIZE, row_w), dtype=kv_flat.dtype, buffer=nl.sbuf)
        v_rows = nl.ndarray((B_P_SIZE, row_w), dtype=kv_flat.dtype, buffer=nl.sbuf)
        for m in nl.affine_range(blocks_per_load):
            k_rows[m * T + i_t, i_f] = nl.load(
                kv_flat[0, block_rows[m * T + i_t, l * n_tiles + tile_idx], i_f])
            if convert:
                v_rows[m * T + i_t, i_f] = nl.load(
                    kv_flat[1, block_rows[m * T + i_t, l * n_tiles + tile_idx], i_f])
            else:
                v_tile[m * T + i_t, l * row_w + i_f] = nl.load(
                    kv_flat[1, block_rows[m * T + i_t, l * n_tiles + tile_idx], i_f])
        if convert:
            k_rows = nisa.tensor_copy(k_rows, dtype=kernel_dtype, engine=nisa.scalar_engine)
            v_tile[:, nl.ds(l * row_w, row_w)] = nisa.tensor_copy(
                v_rows, dtype=kernel_dtype, engine=nisa.scalar_engine)
        # the product loader's K transposes, call for call (nki_kernels/dense/kv_load.py)
        transpose_keys(ops, k_tile, l, k_rows, v_tile, tiled_block_size=bp, head_size=d)
    return k_tile, v_tile
