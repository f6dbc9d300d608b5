"""DMA instruction / descriptor / byte counts of the cache-op kernels, read from the simulator trace.

Expected counts are written from the kernels' documented DMA plans (one index + K + V load per
chunk of 128-row tiles, two indirect stores per tile; one index load per chunk and a gather +
scatter per tile for block copies), with sizes chosen so every bulk tile fits one chunk. The
counts hold on both NKI APIs (``api``; trn2): one kernel source, the same DMA plan.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import nki_sim
from host.cache.cache_ops import allocate_kv_caches, copy_blocks, reshape_and_cache, swap_blocks

pytestmark = pytest.mark.simulation
APIS = ("legacy", "nki")


def dma_events(trace):
    return [e for e in trace.events if e.engine == "dma"]


def indirect(trace):
    return [e for e in dma_events(trace) if e.dma_kind == "indirect"]


def write_counts(rows):
    """DMA instructions of kv_cache_update when all full tiles fit one chunk."""
    n_tiles, rem = divmod(rows, 128)
    return (3 if n_tiles else 0) + 2 * n_tiles + (5 if rem else 0)


@pytest.mark.parametrize("n_tok,n_heads,n_neg", [
    (1, 1, 0), (16, 8, 0), (100, 8, 10), (129, 1, 1), (300, 4, 40),
])
@pytest.mark.parametrize("api", APIS)
def test_cache_write_dma_counts(one_core, rng, n_tok, n_heads, n_neg, api):
    d, block_size = 16, 8
    n_blocks = math.ceil(n_tok / block_size) + 1
    cache = np.zeros((2, n_blocks, n_heads, block_size, d), np.float32)
    key = rng.standard_normal((n_tok, n_heads, d)).astype(np.float32)
    value = rng.standard_normal((n_tok, n_heads, d)).astype(np.float32)
    slots = rng.permutation(n_blocks * block_size)[:n_tok]
    slots[:n_neg] = -1
    with nki_sim.tracing() as trace:
        reshape_and_cache(key, value, cache, slots, api=api)
    rows, valid = n_tok * n_heads, (n_tok - n_neg) * n_heads
    ind = indirect(trace)
    assert len(ind) == 2 * math.ceil(rows / 128)                        # 128 rows per scatter
    assert all(e.partitions <= 128 for e in ind)
    assert sum(e.bytes for e in ind) == 2 * valid * d * 4               # skipped rows move nothing
    assert sum(len(e.descriptor_bytes) for e in ind) == 2 * valid       # one descriptor per row
    assert sum(e.skipped_rows for e in ind) == 2 * (rows - valid)
    assert len(dma_events(trace)) == write_counts(rows)
    summary = trace.summary()
    assert summary["dma_instructions"] == write_counts(rows)
    assert summary["dma_indirect_instructions"] == len(ind)


def test_cache_write_direct_loads_one_descriptor_per_partition(one_core, rng):
    """The chunked K / V / index loads read one contiguous run per partition."""
    n_tok, n_heads, d = 128, 3, 8                                        # 384 rows = 3 full tiles
    cache = np.zeros((2, 40, n_heads, 4, d), np.float32)
    kv = rng.standard_normal((n_tok, n_heads, d)).astype(np.float32)
    with nki_sim.tracing() as trace:
        reshape_and_cache(kv, kv, cache, rng.permutation(160)[:n_tok])
    direct = [e for e in dma_events(trace) if e.dma_kind == "direct"]
    assert len(direct) == 3
    assert all(len(e.descriptor_bytes) == 128 for e in direct)
    assert sorted(e.bytes for e in direct) == sorted([384 * 4, 384 * d * 4, 384 * d * 4])


def test_per_token_baseline_counts(rng):
    """The benchmark baseline: 5 DMAs per token, same indirect payload as the product kernel."""
    from host.cache.cache_ops import cache_write_row_index
    from nki_kernels.baselines.kv_write_per_token import kv_write_per_token

    n_tok, n_heads, d, n_blocks, block_size = 20, 4, 8, 6, 4
    key = rng.standard_normal((n_tok, n_heads, d)).astype(np.float32)
    value = rng.standard_normal((n_tok, n_heads, d)).astype(np.float32)
    slots = rng.permutation(n_blocks * block_size)[:n_tok]
    slots[0] = -1
    base = rng.standard_normal((2, n_blocks, n_heads, block_size, d)).astype(np.float32)
    ours = base.copy()
    reshape_and_cache(key, value, ours, slots)
    theirs = base.copy()
    idx = cache_write_row_index(slots, num_blocks=n_blocks, num_kv_heads=n_heads,
                                block_size=block_size).reshape(n_tok, n_heads, 1)
    with nki_sim.tracing() as trace:
        kv_write_per_token(key, value, theirs, idx)
    assert theirs.tobytes() == ours.tobytes()
    assert len(dma_events(trace)) == 5 * n_tok
    assert len(indirect(trace)) == 2 * n_tok
    assert sum(e.bytes for e in indirect(trace)) == 2 * (n_tok - 1) * n_heads * d * 4


@pytest.mark.parametrize("n_layers,n_copy,hkv,block_size,d,max_row_bytes", [
    (1, 1, 1, 2, 4, 16384),       # M = 2 rows: one tail tile
    (3, 2, 2, 4, 8, 16384),       # 3 layers coalesced: M = 12 rows -> 1 gather + 1 scatter
    (4, 20, 1, 4, 4, 16384),      # M = 160: one full tile + tail
    (2, 8, 2, 8, 16, 256),        # slab 256 el = 1 KiB split into 4 rows of 64: M = 128
])
@pytest.mark.parametrize("api", APIS)
def test_block_copy_dma_counts(one_core, rng, n_layers, n_copy, hkv, block_size, d, max_row_bytes, api):
    n_blocks = 2 * n_copy + 1
    layers = allocate_kv_caches(n_layers, n_blocks, hkv, block_size, d)
    for layer in layers:
        layer[...] = rng.standard_normal(layer.shape)
    ids = rng.permutation(n_blocks)[:2 * n_copy]
    mapping = np.stack([ids[:n_copy], ids[n_copy:]], axis=1)
    with nki_sim.tracing() as trace:
        copy_blocks(layers, mapping, max_row_bytes=max_row_bytes, api=api)
    slab_bytes = hkv * block_size * d * 4
    row_bytes = min(slab_bytes, max_row_bytes)
    m = n_layers * 2 * n_copy * (slab_bytes // row_bytes)
    n_tiles, rem = divmod(m, 128)
    ind = indirect(trace)
    assert len(ind) == 2 * math.ceil(m / 128)                           # across all layers
    assert sum(e.bytes for e in ind) == 2 * m * row_bytes
    assert sum(len(e.descriptor_bytes) for e in ind) == 2 * m
    assert len(dma_events(trace)) == (1 if n_tiles else 0) + 2 * n_tiles + (3 if rem else 0)


@pytest.mark.parametrize("api", APIS)
def test_swap_blocks_dma_counts(one_core, rng, api):
    src = rng.standard_normal((2, 30, 2, 4, 8)).astype(np.float32)
    dst = np.zeros((2, 10, 2, 4, 8), np.float32)
    mapping = np.stack([np.arange(10) * 3, np.arange(10)], axis=1)
    with nki_sim.tracing() as trace:
        swap_blocks(src, dst, mapping, api=api)
    assert len(indirect(trace)) == 2                                     # 20 rows: 1 gather + 1 scatter
    assert len(dma_events(trace)) == 3
    assert sum(e.bytes for e in indirect(trace)) == 2 * 20 * 2 * 4 * 8 * 4


@pytest.mark.parametrize("api", APIS)
def test_chunked_dma_counts(one_core, rng, monkeypatch, api):
    """Several chunks: 3 loads per chunk (write) / 1 index load per chunk (copy), 2 DMAs per tile."""
    import nki_kernels.cache.block_copy as bc
    import nki_kernels.cache.kv_cache_update as kvu

    monkeypatch.setattr(kvu, "CHUNK_BUDGET_BYTES", 2 * (2 * 8 * 4 + 4))   # 2 tiles per chunk
    monkeypatch.setattr(bc, "INDEX_CHUNK_BUDGET_BYTES", 2 * 8)            # 2 tiles per chunk
    n_tok = 5 * 128 + 9                                                    # 5 tiles (chunks 2+2+1) + tail
    cache = np.zeros((2, 170, 1, 4, 8), np.float32)
    kv = rng.standard_normal((n_tok, 1, 8)).astype(np.float32)
    with nki_sim.tracing() as trace:
        reshape_and_cache(kv, kv, cache, rng.permutation(680)[:n_tok], api=api)
    assert len(dma_events(trace)) == 3 * 3 + 2 * 5 + 5
    assert len(indirect(trace)) == 2 * 6

    layers = allocate_kv_caches(1, 700, 1, 1, 4)                           # one row per (kv, block)
    mapping = np.stack([np.arange(n_tok // 2 + 1), 350 + np.arange(n_tok // 2 + 1)], axis=1)
    with nki_sim.tracing() as trace:
        copy_blocks(layers, mapping, api=api)                              # M = 2 * 325 = 650 rows
    n_tiles, rem = divmod(2 * len(mapping), 128)                           # 5 tiles + 10 rows
    assert (n_tiles, rem) == (5, 10)
    assert len(dma_events(trace)) == 3 * 1 + 2 * 5 + 3
    assert len(indirect(trace)) == 2 * 6
