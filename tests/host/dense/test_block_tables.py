"""host/dense/block_tables.py: hand-computed tables, the transform and its inverse, load order, checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from host.dense.block_tables import (active_block_table, from_partition_first,
                               inverse_transform_block_tables, load_column_tokens,
                               loaded_cache_slots, to_partition_first, transform_block_tables,
                               transform_block_tables_all_heads)
from host.dense.plan import make_plan


# ---------------------------------------------------------------- active block table (hand)
def test_active_block_table_hand_computed():
    # B=4: seq0 has ctx 5 -> 2 blocks, seq1 ctx 0 -> none, seq2 ctx 4 -> 1 block.
    p = make_plan([1, 2, 1], [5, 0, 4], block_size=4, large_tile_size=512)
    bt = np.array([[7, 2, -1],
                   [-1, -1, -1],
                   [9, 5, 6]], dtype=np.int32)
    out = active_block_table(p, bt, num_blocks=10)
    assert out.dtype == np.int32 and out.shape == (128,)
    assert out[:3].tolist() == [7, 2, 9]
    assert not out[3:].any()                              # padding entries are block 0


def test_active_block_table_all_empty_context():
    p = make_plan([3], [0], block_size=8, large_tile_size=512)
    out = active_block_table(p, np.zeros((1, 0), dtype=np.int64))
    assert out.shape == (64,) and not out.any()


# ---------------------------------------------------------------- transform (hand)
def test_transform_hand_computed_tiled():
    # B=256, LT=2048: M=8 blocks/tile, Tf=16, b'=16, L=128 rows (one load).
    # out[0, p, 0] = (bt[p // 16] * Hkv + h) * 16 + p % 16 with Hkv=2, h=1.
    bt = np.array([7, 3, 0, 0, 0, 0, 0, 0])
    out = transform_block_tables(bt, num_kv_heads=2, head_id=1, block_size=256, large_tile_size=2048)
    assert out.shape == (1, 128, 1) and out.dtype == np.int32
    col = out[0, :, 0]
    assert col[:16].tolist() == list(range(240, 256))      # (7*2+1)*16 + t
    assert col[16:32].tolist() == list(range(112, 128))    # (3*2+1)*16 + t
    assert col[32:].tolist() == [16 + (p % 16) for p in range(32, 128)]   # (0*2+1)*16 + t


def test_transform_hand_computed_two_loads_two_tiles():
    # B=4, LT=1024: M=256, Tf=1, L=256 -> out (2, 128, n_tiles); out[l, p, j] = bt[j*256 + l*128 + p].
    bt = np.arange(512) * 3 + 1
    out = transform_block_tables(bt, num_kv_heads=1, head_id=0, block_size=4, large_tile_size=1024)
    assert out.shape == (2, 128, 2)
    assert out[0, 0, 0] == bt[0]
    assert out[1, 5, 1] == bt[256 + 128 + 5]
    assert out[0, 127, 1] == bt[256 + 127]


def test_all_heads_matches_single_head():
    rng = np.random.default_rng(1)
    bt = rng.integers(0, 50, size=3 * 64)
    allh = transform_block_tables_all_heads(bt, num_kv_heads=4, block_size=32, large_tile_size=2048)
    assert allh.shape == (4, 1, 128, 3)
    for h in range(4):
        one = transform_block_tables(bt, num_kv_heads=4, head_id=h, block_size=32, large_tile_size=2048)
        np.testing.assert_array_equal(allh[h], one)


# ---------------------------------------------------------------- round trips
BLOCKS = st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256])
TILES = st.sampled_from([512, 1024, 2048, 4096, 8192])


@settings(max_examples=40, deadline=None)
@given(B=BLOCKS, LT=TILES, n_tiles=st.integers(1, 3), Hkv=st.integers(1, 5), data=st.data())
def test_transform_inverse_round_trip(B, LT, n_tiles, Hkv, data):
    M = LT // B
    h = data.draw(st.integers(0, Hkv - 1))
    seed = data.draw(st.integers(0, 2**16))
    bt = np.random.default_rng(seed).integers(0, 10_000, size=n_tiles * M).astype(np.int32)
    t = transform_block_tables(bt, num_kv_heads=Hkv, head_id=h, block_size=B, large_tile_size=LT)
    assert t.shape == (max(M, 128) // 128, 128, n_tiles)
    back, head = inverse_transform_block_tables(t, num_kv_heads=Hkv, block_size=B, large_tile_size=LT)
    np.testing.assert_array_equal(back, bt)
    assert head == h
    np.testing.assert_array_equal(from_partition_first(to_partition_first(t)), t)


def test_partition_first_layout():
    t = np.arange(2 * 128 * 3).reshape(2, 128, 3)
    pf = to_partition_first(t)
    assert pf.shape == (128, 2, 3)
    assert pf[5, 1, 2] == t[1, 5, 2]


# ---------------------------------------------------------------- load order (hand)
def test_load_column_tokens_hand_computed():
    # B=32, LT=2048: b'=16, one load. Column c = s*128 + p holds tile token tau = p*16 + s.
    order = load_column_tokens(2, block_size=32, large_tile_size=2048)
    assert order.shape == (4096,)
    assert order[:3].tolist() == [0, 16, 32]             # s=0, p=0,1,2
    assert order[127] == 127 * 16                        # s=0, p=127
    assert order[128:130].tolist() == [1, 17]            # s=1, p=0,1
    assert order[2047] == 2047                           # s=15, p=127 -> 127*16 + 15
    assert order[2048 + 1] == 2048 + 16                  # second tile is offset by LT
    assert sorted(order.tolist()) == list(range(4096))


def test_load_column_tokens_identity_when_tiled_block_is_one():
    np.testing.assert_array_equal(load_column_tokens(1, block_size=1, large_tile_size=512),
                                  np.arange(512))


def test_loaded_cache_slots_hand_computed():
    # B=32, LT=2048, Hkv=2, h=0; tile blocks [5, 9, 0, ...]. Row r -> block r//2//2, t = r % 2.
    bt = np.zeros(64, dtype=np.int32)
    bt[:2] = [5, 9]
    t = transform_block_tables(bt, num_kv_heads=2, head_id=0, block_size=32, large_tile_size=2048)
    slots = loaded_cache_slots(t, num_kv_heads=2, block_size=32, large_tile_size=2048)
    assert slots[0] == 5 * 32            # p=0 -> block 5, sub-block 0, s=0
    assert slots[1] == 5 * 32 + 16       # p=1 -> block 5, sub-block 1
    assert slots[2] == 9 * 32            # p=2 -> block 9
    assert slots[128] == 5 * 32 + 1      # s=1, p=0
    assert slots[129] == 5 * 32 + 17


# ---------------------------------------------------------------- torch in kind
def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    p = make_plan([1, 1], [3, 4], block_size=2, large_tile_size=512)
    bt = torch.tensor([[4, 1], [2, 3]], dtype=torch.int32)
    a = active_block_table(p, bt)
    assert isinstance(a, torch.Tensor) and a.dtype == torch.int32
    t = transform_block_tables(a, num_kv_heads=1, head_id=0, block_size=2, large_tile_size=512)
    assert isinstance(t, torch.Tensor)
    back, h = inverse_transform_block_tables(t, num_kv_heads=1, block_size=2, large_tile_size=512)
    assert torch.equal(back, a) and h == 0


# ---------------------------------------------------------------- validation
P = make_plan([1, 1], [5, 2], block_size=4, large_tile_size=512)


@pytest.mark.parametrize("bt,kw,arg,fragment", [
    (np.zeros((3, 2), np.int32), {}, "block_tables", "have shape (2, *)"),
    (np.zeros((2, 1), np.int32), {}, "block_tables", "at least ceil(context_lens[0]=5 / block_size=4) = 2 columns"),
    (np.zeros((2, 2), np.float32), {}, "block_tables", "integer dtype"),
    (np.zeros(4, np.int32), {}, "block_tables", "be 2-D"),
    (np.array([[1, -1], [2, 0]]), {}, "block_tables", "got block_tables[0, 1] = -1"),
    (np.array([[1, 2], [7, 0]]), dict(num_blocks=7), "block_tables", "< num_blocks=7 (inside the cache); got block_tables[1, 0] = 7"),
    (np.array([[1, 2], [3, 0]]), dict(num_blocks=0), "num_blocks", "be >= 1"),
])
def test_active_block_table_rejects(bt, kw, arg, fragment):
    with pytest.raises(ValueError, match=f"^{arg} must ") as ei:
        active_block_table(P, bt, **kw)
    assert fragment in str(ei.value)


def test_active_block_table_ignores_unused_entries():
    bt = np.array([[1, 2, -1, 99], [3, -5, -5, -5]])
    assert active_block_table(P, bt, num_blocks=4)[:3].tolist() == [1, 2, 3]


TGOOD = dict(num_kv_heads=2, head_id=1, block_size=32, large_tile_size=2048)


@pytest.mark.parametrize("bt,kw,arg,fragment", [
    (np.zeros(63, np.int32), {}, "active_table", "positive multiple of blocks_per_tile=64"),
    (np.zeros(0, np.int32), {}, "active_table", "got 0 entries"),
    (np.zeros((2, 64), np.int32), {}, "active_table", "be 1-D"),
    (np.zeros(64, np.float64), {}, "active_table", "integer dtype"),
    (np.full(64, -2), {}, "active_table", "block ids in [0,"),
    (np.full(64, 2**30), {}, "active_table", "<= 2147483647"),
    (np.zeros(64, np.int32), dict(num_kv_heads=0), "num_kv_heads", "be >= 1"),
    (np.zeros(64, np.int32), dict(head_id=2), "head_id", "be <= 1; got 2"),
    (np.zeros(64, np.int32), dict(head_id=-1), "head_id", "be >= 0"),
    (np.zeros(64, np.int32), dict(block_size=24), "block_size", "power of two"),
    (np.zeros(64, np.int32), dict(large_tile_size=100), "large_tile_size", "power of two"),
])
def test_transform_rejects(bt, kw, arg, fragment):
    with pytest.raises(ValueError, match=f"^{arg} must ") as ei:
        transform_block_tables(bt, **{**TGOOD, **kw})
    assert fragment in str(ei.value)


def _good_transformed():
    bt = np.arange(64, dtype=np.int32)
    return transform_block_tables(bt, **TGOOD)


def test_inverse_rejects_non_images():
    kw = dict(num_kv_heads=2, block_size=32, large_tile_size=2048)
    t = _good_transformed().copy()
    t[0, 0, 0] += 1                                   # sub-block id no longer q % Tf
    with pytest.raises(ValueError, match="^transformed must .*sub-block index"):
        inverse_transform_block_tables(t, **kw)
    t = _good_transformed().copy()
    t[0, 1, 0] += 2 * 2                               # second half of block 0 names another block
    with pytest.raises(ValueError, match="^transformed must give the same"):
        inverse_transform_block_tables(t, **kw)
    t = _good_transformed().copy()
    t[0, 0:2, 0] -= 2                                 # block 0 now encodes head 0, the rest head 1
    with pytest.raises(ValueError, match="^transformed must encode a single KV head"):
        inverse_transform_block_tables(t, **kw)
    with pytest.raises(ValueError, match=r"^transformed must have shape \(1, 128, \*\)"):
        inverse_transform_block_tables(np.zeros((2, 128, 1), np.int32), **kw)
    with pytest.raises(ValueError, match="^transformed must hold flat-view row ids"):
        inverse_transform_block_tables(np.full((1, 128, 1), -1), **kw)


def test_partition_first_rejects_bad_shapes():
    with pytest.raises(ValueError, match="^transformed must have shape"):
        to_partition_first(np.zeros((1, 64, 1)))
    with pytest.raises(ValueError, match="^sbuf_table must have shape"):
        from_partition_first(np.zeros((64, 1, 1)))


def test_load_order_rejects():
    with pytest.raises(ValueError, match="^num_large_tiles must be >= 1"):
        load_column_tokens(0, block_size=4, large_tile_size=512)
    with pytest.raises(ValueError, match="^transformed must have shape"):
        loaded_cache_slots(np.zeros((1, 64, 1), np.int32), num_kv_heads=1, block_size=4,
                           large_tile_size=512)
