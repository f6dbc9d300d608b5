"""In-kernel block-table load and transform for the vectorized (indirect-DMA) KV loads.

Device code (legacy NKI). Layout spec: ``docs/layouts.md`` (block-table transform); the host
reference of the same transform is ``host.dense.block_tables.transform_block_tables`` (whose output
``(nL, 128, n_tiles)`` is this tile with the partition axis moved first).

Dimensions:
    N      num_blocks of the KV cache          Hkv  KV heads (grid axis 1)
    B      block_size                          LT   LARGE_TILE_SZ
    M      LT // B blocks per large tile       T    128 // M if M < 128 else 1 (tiling factor)
    L      M * T = max(M, 128) rows per tile   nL   L // 128 indirect loads per tile
    n_tiles = num_active_blocks // M
"""

from __future__ import annotations

import numpy as np

from nki_kernels.toolchain import nl, nisa
from nki_kernels.constants import B_P_SIZE


def load_block_tables(block_tables, *, num_tiles, blocks_per_tile, tiling_factor,
                      num_kv_heads, head_id):
    """Load the flat active block table and turn block ids into rows of the flat cache view.

    Args:
        block_tables: HBM int32 (num_tiles * M,): per-sequence context blocks concatenated,
            padded (with valid ids, e.g. 0) to a multiple of M.
        num_tiles: number of large tiles n_tiles (>= 1).
        blocks_per_tile: M.  tiling_factor: T.  num_kv_heads: Hkv.
        head_id: this program's KV head (``nl.program_id(1)``).

    Returns:
        SBUF int32 tile ``(128, nL, n_tiles)`` with
        ``out[p, l, j] = (bt[j*M + q // T] * Hkv + head_id) * T + q % T``, ``q = l*128 + p``:
        the row of ``kv_cache.reshape((2, N*Hkv*T, b'*d))[k_or_v]`` that partition p of indirect
        load l of large tile j gathers (b' consecutive tokens of one block of this head).

    Pseudocode:
        for each chunk of <= 128 tiles (tiles on partitions, blocks on the free axis):
            ids   = load bt[j*M : (j+1)*M] for the chunk's tiles           (nj, M) int32
            base  = ids * (Hkv*T) + head_id*T                              (nj, M) fp32
            rows[:, m*T + t] = base[:, m] + t  for t < T                   (nj, L) fp32
            for l < nL: out[:, l, chunk] = transpose(rows[:, l*128:(l+1)*128])  (PE, via PSUM)
        Ids travel as fp32 (exact below 2**24; the kernel checks N*Hkv*T < 2**24).
    """
    M, T = blocks_per_tile, tiling_factor
    L = M * T
    n_loads = L // B_P_SIZE
    out = nl.ndarray((B_P_SIZE, n_loads, num_tiles), dtype=nl.int32, buffer=nl.sbuf)
    bt2d = block_tables.reshape((num_tiles, M))
    # head_id * T as a (1, 1) tile: program ids enter arithmetic through iota (as in vLLM's kernel).
    head_off = nisa.iota(head_id * T, dtype=nl.float32).reshape((1, 1))
    n_chunks = (num_tiles + B_P_SIZE - 1) // B_P_SIZE
    for c in nl.static_range(n_chunks):           # static: the last chunk may be shorter
        nj = min(B_P_SIZE, num_tiles - c * B_P_SIZE)
        ids = nl.load(bt2d[c * B_P_SIZE:c * B_P_SIZE + nj, :])
        scaled = nisa.tensor_scalar(ids, np.multiply, float(num_kv_heads * T), dtype=nl.float32)
        base = nl.add(scaled, head_off, dtype=nl.float32)          # partition-broadcast add
        if T == 1:
            rows = base
        else:
            rows = nl.ndarray((nj, L), dtype=nl.float32)
            i_p = nl.arange(nj)[:, None]
            i_m = nl.arange(M)[None, :]
            for t in nl.static_range(T):          # static: t is an immediate operand
                rows[i_p, T * i_m + t] = nisa.tensor_scalar(base, np.add, float(t), dtype=nl.float32)
        for l in nl.affine_range(n_loads):
            t_psum = nl.ndarray((B_P_SIZE, nj), dtype=nl.float32, buffer=nl.psum)
            t_psum[...] = nisa.nc_transpose(rows[:, nl.ds(l * B_P_SIZE, B_P_SIZE)])
            out[:, l, nl.ds(c * B_P_SIZE, nj)] = nl.copy(t_psum, dtype=nl.int32)
    return out
