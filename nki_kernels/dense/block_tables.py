"""In-kernel block-table load and transform for the vectorized (indirect-DMA) KV loads.

Device code on the op layer (:mod:`nki_kernels.ops`; every function takes it first). Layout
spec: ``docs/layouts.md`` (block-table transform); the host reference of the same transform is
``host.dense.block_tables.transform_block_tables`` (whose output ``(nL, 128, n_tiles)`` is this
tile with the partition axis moved first and the (load, tile) axes flattened).

Dimensions:
    N      num_blocks of the KV cache          Hkv  KV heads
    B      block_size                          LT   LARGE_TILE_SZ
    M      LT // B blocks per large tile       T    128 // M if M < 128 else 1 (tiling factor)
    L      M * T = max(M, 128) rows per tile   nL   L // 128 indirect loads per tile
    n_tiles = num_active_blocks // M
"""

from __future__ import annotations

from nki_kernels.constants import B_P_SIZE


def load_block_tables(ops, block_tables, *, num_tiles, blocks_per_tile, tiling_factor,
                      num_kv_heads, head_row):
    """Load the flat active block table and turn block ids into rows of the flat cache view.

    Args:
        ops: the op layer.
        block_tables: HBM int32 (num_tiles * M,): per-sequence context blocks concatenated,
            padded (with valid ids, e.g. 0) to a multiple of M.
        num_tiles: number of large tiles n_tiles (>= 1).
        blocks_per_tile: M.  tiling_factor: T.  num_kv_heads: Hkv.
        head_row: the KV head's row offset ``head_id * T`` when the head enters the row ids
            (``ops.head_rows``: the legacy API, where ``head_id`` is the program id), or None
            when it enters the gathers' HBM offset instead (the current API: the ids then carry
            no head term, ``head_id`` = 0 below).

    Returns:
        SBUF int32 tile ``(128, nL * n_tiles)`` with ``out[p, l*n_tiles + j] = (bt[j*M + q // T]
        * Hkv + head_id) * T + q % T``, ``q = l*128 + p``: the row of ``kv_cache.reshape((2,
        N*Hkv*T, b'*d))[k_or_v]`` that partition p of indirect load l of large tile j gathers
        (b' consecutive tokens of one block of this head).

    Pseudocode:
        for each chunk of <= 128 tiles (tiles on partitions, blocks on the free axis):
            ids   = load bt[j*M : (j+1)*M] for the chunk's tiles           (nj, M) int32
            base  = ids * (Hkv*T) [+ head_row]                             (nj, M) fp32
            rows[:, m*T + t] = base[:, m] + t  for t < T (one add)        (nj, L) fp32
            for l < nL: out[:, l*n_tiles + chunk] = transpose(rows[:, l*128:(l+1)*128])  (PE)
        Ids travel as fp32 (exact below 2**24; the kernel checks N*Hkv*T < 2**24).
    """
    M, T = blocks_per_tile, tiling_factor
    L = M * T
    n_loads = L // B_P_SIZE
    out = ops.sbuf((B_P_SIZE, n_loads * num_tiles), ops.int32)
    bt2d = block_tables.reshape((num_tiles, M))
    n_chunks = (num_tiles + B_P_SIZE - 1) // B_P_SIZE
    for c in ops.static_range(n_chunks):          # static: the last chunk may be shorter
        nj = min(B_P_SIZE, num_tiles - c * B_P_SIZE)
        ids = ops.sbuf((nj, M), ops.int32)
        ops.load(ids, bt2d[c * B_P_SIZE:c * B_P_SIZE + nj, :])
        if head_row is None:
            base = ops.sbuf((nj, M), ops.float32)
            ops.tensor_scalar(base, ids, "multiply", float(num_kv_heads * T))
        else:
            # head_id * T on every partition (the head enters arithmetic through iota, as in
            # vLLM's kernel), added in the same pass that scales the ids
            head_off = ops.sbuf((nj, 1), ops.float32)
            ops.iota(head_off, step=0, offset=head_row)
            base = ops.sbuf((nj, M), ops.float32)
            ops.tensor_scalar(base, ids, "multiply", float(num_kv_heads * T), op1="add",
                              operand1=head_off)
        if T == 1:
            rows = base
        else:
            # rows[:, m*T + t] = base[:, m] + t: one add of two broadcast views, (nj, M, T)
            sub = ops.sbuf((nj, T), ops.float32)
            ops.iota(sub, step=1)
            rows = ops.sbuf((nj, L), ops.float32)
            ops.tensor_tensor(ops.free_view(rows, ((T, M), (1, T))),
                              ops.free_view(base, ((1, M), (0, T))),
                              ops.free_view(sub, ((0, M), (1, T))), "add")
        for l in ops.parallel_range(n_loads):
            t_psum = ops.psum((B_P_SIZE, nj), ops.float32)
            ops.transpose(t_psum, rows[:, ops.ds(l * B_P_SIZE, B_P_SIZE)])
            ops.copy(out[:, ops.ds(l * num_tiles + c * B_P_SIZE, nj)], t_psum)
    return out
