"""The KV loads really are vectorized: per (KV head, large tile) ceil(L/128) indirect DMAs for K
and as many for V, each with min(L, 128) = 128 descriptors of b'*d*itemsize bytes
(vLLM's vectorized KV load), read from the simulator's trace, on both APIs."""

from __future__ import annotations

import pytest

import nki_sim
from host.attention import flash_attn_varlen_nkifunc
from nki_kernels.constants import tile_geometry

pytestmark = pytest.mark.simulation


# (block_size, LARGE_TILE_SZ, d): L/128 = 4, 2, 1 (T = 1), 1 (T = 16), 1 (b' = 64), 2 (b' = 32)
GEOMETRIES = [(1, 512, 8), (4, 1024, 16), (16, 2048, 8), (256, 2048, 8), (64, 8192, 4), (32, 8192, 128)]


@pytest.mark.parametrize("api", ["legacy", "nki"])
@pytest.mark.parametrize("block_size, tile, d", GEOMETRIES,
                         ids=[f"b{b}_t{t}_d{d}" for b, t, d in GEOMETRIES])
def test_kv_loads_are_vectorized_indirect_dmas(block_size, tile, d, api, batch_factory,
                                               build_kernel_inputs):
    Hkv = 2
    # contexts spanning 2 large tiles in total (plus padding blocks)
    c = [tile // 2 + 3, tile // 2 + 1]
    batch = batch_factory(block_size, [3, 1], c, H=2 * Hkv, Hkv=Hkv, d=d, block_size=block_size)
    plan, inputs = build_kernel_inputs(batch, large_tile_size=tile)
    M, T, bp, L, n_loads = tile_geometry(block_size, tile)
    assert (M, T, bp, L) == (plan.blocks_per_tile, plan.tiling_factor, plan.tiled_block_size,
                             plan.rows_per_tile)
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
        flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=tile, mixed_precision=True,
                                  backend="sim", api=api)

    gathers = [e for e in trace.events if e.engine == "dma" and e.dma_kind == "indirect"]
    n_tiles = plan.num_large_tiles
    assert n_tiles >= 2
    # per (KV head, large tile): n_loads gathers for K and n_loads for V (one Q-tile group here,
    # so each tile is loaded once per KV head), all from the op layer's one row-gather statement
    assert len(gathers) == 2 * n_loads * n_tiles * Hkv
    assert len({e.src_loc for e in gathers}) == 1
    row_bytes = bp * d * batch.kv_cache.dtype.itemsize
    for e in gathers:
        assert e.partitions == 128
        assert e.descriptor_bytes == (row_bytes,) * min(L, 128), (e.src_loc, e.descriptor_bytes[:4])
        assert e.bytes == 128 * row_bytes
        assert e.src_buffer == "hbm" and e.dst_buffer == "sbuf"
    # the summary agrees with the events
    assert trace.summary()["dma_indirect_instructions"] == len(gathers)
