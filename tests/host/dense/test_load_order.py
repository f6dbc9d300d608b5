"""Acceptance: K/V rows gathered through the transformed block table, in the vectorized load's
column order, are the reference's context K/V rows permuted exactly like the reordered mask.

The load is emulated here from the formulas in docs/layouts.md §4-§5 (flat cache view
(N*Hkv*Tf, b'*d); load l of tile j puts row transformed[l, p, j] on partition p; K column
c = l*128*b' + s*128 + p is element group s of partition p). The reference rows are gathered
from the *2-D* block tables with plain indexing (token k of sequence i at block
block_tables[i, k // B], offset k % B), like host/reference.py, without the active table.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from host.dense.block_tables import (active_block_table, load_column_tokens, loaded_cache_slots,
                               transform_block_tables)
from host.dense.masks import build_attention_mask, reorder_context_mask
from host.dense.plan import make_plan

P = 128


def emulate_vectorized_load(cache_kv: np.ndarray, transformed: np.ndarray, Tf: int, bp: int) -> np.ndarray:
    """(N, Hkv, B, d) cache half + (nL, 128, n) table -> (n * LT, d) rows in K-column order."""
    N, Hkv, B, d = cache_kv.shape
    flat = cache_kv.reshape(N * Hkv * Tf, bp * d)             # the kernel's flattened view
    nL, _, n = transformed.shape
    x = flat[transformed]                                      # (nL, 128, n, b'*d): one DMA per (l, j)
    x = x.reshape(nL, P, n, bp, d)                             # [l, p, j, s, :]
    return x.transpose(2, 0, 3, 1, 4).reshape(n * nL * bp * P, d)   # column j*LT + l*128*b' + s*128 + p


def natural_context_rows(cache_kv, bt2d, qlens, clens, B, ctx_len, head):
    """Reference context rows in natural order (+ owner seq, + cache slot); NaN/-1 where no token."""
    d = cache_kv.shape[-1]
    rows = np.full((ctx_len, d), np.nan)
    owner = np.full(ctx_len, -1)
    slot = np.full(ctx_len, -1)
    start = 0
    for i, c in enumerate(clens):
        k = np.arange(c)
        blk = bt2d[i, k // B]
        rows[start + k] = cache_kv[blk, head, k % B]
        owner[start + k] = i
        slot[start + k] = blk * B + k % B
        start += -(-c // B) * B                                # sequences start on block boundaries
    return rows, owner, slot


BLOCKS = st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256])
TILES = st.sampled_from([512, 1024, 2048, 4096, 8192])


@settings(max_examples=100, deadline=None)
@given(B=BLOCKS, LT=TILES, Hkv=st.integers(1, 4), seed=st.integers(0, 10_000),
       lens=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 5000)), min_size=1, max_size=4))
def test_gather_through_transformed_table_matches_reordered_reference(B, LT, Hkv, seed, lens):
    qlens, clens = map(list, zip(*lens))
    check_load_matches_reference(B, LT, Hkv, qlens, clens, seed)


@pytest.mark.parametrize("B,LT,Hkv,qlens,clens,extra_tiles", [
    # block 1 (b' = 1, identity reorder), decode tokens, one sequence without context
    pytest.param(1, 512, 2, [1, 1, 3], [700, 0, 5], 0, id="blk1_lt512_decode_ctx0"),
    # vLLM's default geometry (Tf=2, b'=16); odd lengths; a whole extra tile of padding blocks
    pytest.param(32, 2048, 3, [7, 1], [2049, 33], 1, id="blk32_lt2048_odd_plus_pad_tile"),
    # Tf=16 (M=8 blocks per tile), MQA
    pytest.param(256, 2048, 1, [5], [3000], 0, id="blk256_lt2048_tf16_mqa"),
    # M=256 > 128: two indirect loads per tile (nL=2)
    pytest.param(4, 1024, 2, [2, 9], [1023, 1025], 0, id="blk4_lt1024_two_loads"),
    # no context anywhere: the single tile is all padding
    pytest.param(16, 512, 2, [3, 4], [0, 0], 0, id="blk16_no_context"),
])
def test_gather_explicit_cases(B, LT, Hkv, qlens, clens, extra_tiles):
    check_load_matches_reference(B, LT, Hkv, qlens, clens, seed=3, extra_tiles=extra_tiles)


def check_load_matches_reference(B, LT, Hkv, qlens, clens, seed, extra_tiles=0):
    rng = np.random.default_rng(seed)
    d = 2
    lens = list(zip(qlens, clens))
    plan = make_plan(qlens, clens, block_size=B, large_tile_size=LT)
    if extra_tiles:
        plan = make_plan(qlens, clens, block_size=B, large_tile_size=LT,
                         pad_blocks_to=plan.num_active_blocks + extra_tiles * plan.blocks_per_tile)
    nblk = [-(-c // B) for c in clens]
    N = sum(nblk) + 2
    perm = rng.permutation(N)
    bt2d = np.full((len(lens), max(nblk) + 1), -1, dtype=np.int32)
    k = 0
    for i, n in enumerate(nblk):
        bt2d[i, :n] = perm[k:k + n]
        k += n
    cache = rng.standard_normal((2, N, Hkv, B, d))
    active = active_block_table(plan, bt2d, num_blocks=N)
    ctx = plan.context_kv_len
    mask = build_attention_mask(plan)
    # the permutation the reorder applies, read off an integer "mask"
    order = reorder_context_mask(np.arange(ctx + 1)[None, :], LT, B)[0, :ctx]
    np.testing.assert_array_equal(load_column_tokens(plan.num_large_tiles, block_size=B,
                                                     large_tile_size=LT), order)
    qseq = np.repeat(np.arange(len(lens)), qlens)
    for h in range(Hkv):
        t = transform_block_tables(active, num_kv_heads=Hkv, head_id=h, block_size=B, large_tile_size=LT)
        for kv in (0, 1):                                      # K and V take the same rows
            loaded = emulate_vectorized_load(cache[kv], t, plan.tiling_factor, plan.tiled_block_size)
            ref, owner, slot = natural_context_rows(cache[kv], bt2d, qlens, clens, B, ctx, h)
            ref_p, owner_p = ref[order], owner[order]
            real = owner_p >= 0
            np.testing.assert_array_equal(loaded[real], ref_p[real])
        slots = loaded_cache_slots(t, num_kv_heads=Hkv, block_size=B, large_tile_size=LT)
        np.testing.assert_array_equal(slots[real], slot[order][real])
    # mask column c is visible to row r exactly when the loaded token is a real context token of r's sequence
    np.testing.assert_array_equal(mask[:plan.num_queries, :ctx], owner_p[None, :] == qseq[:, None])
    assert not mask[plan.num_queries:].any()
    assert not mask[:, :ctx][:, ~real].any()                  # padding tokens never visible


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(B=BLOCKS, LT=TILES, Hkv=st.integers(1, 8), seed=st.integers(0, 10_000),
       lens=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 20_000)), min_size=1, max_size=12))
def test_gather_sweep_slow(B, LT, Hkv, seed, lens):
    qlens, clens = map(list, zip(*lens))
    check_load_matches_reference(B, LT, Hkv, qlens, clens, seed)
