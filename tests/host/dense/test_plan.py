"""host/dense/plan.py: hand-computed plans, padding rules, immutability, and every validation check."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from host.dense.plan import PagedAttentionPlan, make_plan, round_up


def test_hand_computed_plan_two_sequences():
    # seq0: 3 new tokens after 5 cached ones; seq1: a decode token after 2 cached ones.
    # B=4, LT=512: M=128 blocks/tile >= 128 so Tf=1, b'=4, L=128.
    p = make_plan([3, 1], [5, 2], block_size=4, large_tile_size=512)
    assert p.num_seqs == 2
    assert p.num_queries == 4
    assert p.padded_queries == 128                       # counts below 128 pad to one Q tile
    assert p.query_offsets.tolist() == [0, 3]
    assert p.context_blocks.tolist() == [2, 1]           # ceil(5/4), ceil(2/4)
    assert p.block_offsets.tolist() == [0, 2]
    assert (p.blocks_per_tile, p.tiling_factor, p.tiled_block_size, p.rows_per_tile) == (128, 1, 4, 128)
    assert p.num_active_blocks == 128                    # round_up(3, 128)
    assert p.context_kv_len == 512
    assert p.num_large_tiles == 1
    assert p.seq_lens.tolist() == [8, 3]
    assert p.loads_per_tile == 1 and p.num_query_tiles == 1


def test_hand_computed_plan_tiled_blocks():
    # B=32, LT=2048 (vLLM's default): M=64 < 128 so Tf=2, b'=16, L=128.
    # contexts 100, 0, 64 -> blocks 4, 0, 2 -> 6, rounded up to M=64.
    p = make_plan([200, 1, 1], [100, 0, 64], block_size=32, large_tile_size=2048)
    assert (p.blocks_per_tile, p.tiling_factor, p.tiled_block_size, p.rows_per_tile) == (64, 2, 16, 128)
    assert p.context_blocks.tolist() == [4, 0, 2]
    assert p.block_offsets.tolist() == [0, 4, 4]
    assert p.num_queries == 202 and p.padded_queries == 256
    assert p.num_active_blocks == 64 and p.context_kv_len == 2048 and p.num_large_tiles == 1


def test_large_tile_count_and_rows_per_tile_above_128():
    # B=1, LT=8192: M=8192 rows per tile -> 64 indirect loads per tile.
    p = make_plan([1, 1], [8192, 1], block_size=1, large_tile_size=8192)
    assert p.rows_per_tile == 8192 and p.loads_per_tile == 64 and p.tiling_factor == 1
    assert p.num_active_blocks == 2 * 8192 and p.num_large_tiles == 2


def test_no_context_still_has_one_tile():
    p = make_plan([5, 7], [0, 0], block_size=16, large_tile_size=1024)
    assert p.context_blocks.tolist() == [0, 0]
    assert p.num_active_blocks == p.blocks_per_tile == 64
    assert p.num_large_tiles == 1


@pytest.mark.parametrize("total,expected", [(1, 128), (127, 128), (128, 128), (129, 256), (1000, 1024)])
def test_query_padding(total, expected):
    assert make_plan([total], [0], block_size=8).padded_queries == expected


def test_round_up():
    assert [round_up(x, 64) for x in (0, 1, 64, 65)] == [0, 64, 64, 128]


def test_buckets_override_padding():
    p = make_plan([3, 4], [10, 20], block_size=16, large_tile_size=512,
                  pad_queries_to=512, pad_blocks_to=96)
    assert p.padded_queries == 512
    assert p.num_active_blocks == 96 and p.num_large_tiles == 3


def test_plan_is_frozen_and_arrays_read_only():
    ql = np.array([2, 3])
    p = make_plan(ql, [1, 0], block_size=2, large_tile_size=512)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.block_size = 4  # type: ignore[misc]
    for name in ("query_lens", "context_lens", "query_offsets", "context_blocks", "block_offsets"):
        arr = getattr(p, name)
        assert arr.dtype == np.int64
        with pytest.raises(ValueError):
            arr[0] = 9
    ql[0] = 100                                           # the plan holds its own copy
    assert p.query_lens.tolist() == [2, 3]


def test_equality_and_hash_by_value():
    a = make_plan([2, 3], [1, 0], block_size=2, large_tile_size=512)
    b = PagedAttentionPlan(np.array([2, 3]), (1, 0), 2, 512)
    c = make_plan([2, 3], [1, 1], block_size=2, large_tile_size=512)
    assert a == b and hash(a) == hash(b)
    assert a != c


def test_replace_revalidates():
    a = make_plan([2, 3], [1, 0], block_size=2, large_tile_size=512)
    b = dataclasses.replace(a, block_size=4)
    assert b.block_size == 4 and b.blocks_per_tile == 128
    with pytest.raises(ValueError, match="^block_size must"):
        dataclasses.replace(a, block_size=3)


def test_accepts_torch_lengths():
    torch = pytest.importorskip("torch")
    p = make_plan(torch.tensor([2, 3]), torch.tensor([1, 0]), block_size=2, large_tile_size=512)
    assert p.query_lens.tolist() == [2, 3] and isinstance(p.query_lens, np.ndarray)


GOOD = dict(query_lens=[2, 3], context_lens=[1, 0], block_size=16, large_tile_size=2048)


@pytest.mark.parametrize("override,arg,fragment", [
    (dict(block_size=3), "block_size", "power of two in [1, 256]; got 3"),
    (dict(block_size=0), "block_size", "got 0"),
    (dict(block_size=512), "block_size", "got 512"),
    (dict(block_size=16.0), "block_size", "be an integer; got 16.0"),
    (dict(block_size=True), "block_size", "be an integer; got True"),
    (dict(large_tile_size=256), "large_tile_size", "power of two in [512, 8192]; got 256"),
    (dict(large_tile_size=16384), "large_tile_size", "got 16384"),
    (dict(large_tile_size=3072), "large_tile_size", "got 3072"),
    (dict(query_lens=[2, 0]), "query_lens", "be >= 1 everywhere; got query_lens[1] = 0"),
    (dict(query_lens=[], context_lens=[]), "query_lens", "at least one entry"),
    (dict(query_lens=[[2, 3]]), "query_lens", "be 1-D"),
    (dict(query_lens=[2.0, 3.0]), "query_lens", "integer dtype; got dtype float64"),
    (dict(query_lens=[True, True]), "query_lens", "integer dtype; got dtype bool"),
    (dict(context_lens=[1, -1]), "context_lens", "be >= 0 everywhere; got context_lens[1] = -1"),
    (dict(context_lens=[1, 0, 4]), "context_lens", "have 2 entries"),
    (dict(context_lens=[0.5, 0.0]), "context_lens", "integer dtype"),
    (dict(pad_queries_to=200), "pad_queries_to", "multiple of 128"),
    (dict(query_lens=[200, 3], pad_queries_to=128), "pad_queries_to", ">= max(128"),
    (dict(pad_blocks_to=100), "pad_blocks_to", "multiple of blocks_per_tile=128"),
    (dict(context_lens=[5000, 0], pad_blocks_to=128), "pad_blocks_to", "= 384"),
    (dict(context_lens=[2**31, 0]), "context_lens", "int32"),
])
def test_validation_errors_name_the_argument(override, arg, fragment):
    kw = {**GOOD, **override}
    with pytest.raises(ValueError, match=f"^{arg} must ") as ei:
        make_plan(kw.pop("query_lens"), kw.pop("context_lens"), **kw)
    assert fragment in str(ei.value)


def test_good_inputs_pass():
    assert make_plan(**GOOD).num_queries == 5
