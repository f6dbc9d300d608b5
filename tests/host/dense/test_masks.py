"""host/dense/masks.py: hand-computed masks, the vLLM reorder and its inverse, the fast builder."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from host.dense.masks import (active_mask, build_attention_mask, context_mask, context_row_ranges,
                        context_seq_ids, context_token_order, inverse_reorder_context_mask,
                        query_seq_ids, reorder_context_mask)
from host.dense.plan import make_plan


def _bits(*rows: str) -> np.ndarray:
    return np.array([[c == "1" for c in r] for r in rows], dtype=bool)


# Two sequences: seq0 has 2 new tokens after 5 cached ones, seq1 has 3 new after 2 cached.
# B=4: seq0's context occupies natural columns 0..7 (2 blocks; 5..7 are padding inside block 1),
# seq1's occupies 8..11 (1 block; 10, 11 padding).
def _plan(block_size=4, large_tile_size=512):
    return make_plan([2, 3], [5, 2], block_size=block_size, large_tile_size=large_tile_size)


def test_context_mask_hand_computed():
    m = context_mask(_plan())
    assert m.shape == (128, 512) and m.dtype == bool
    expected = _bits("111110000000",
                     "111110000000",
                     "000000001100",
                     "000000001100",
                     "000000001100")
    np.testing.assert_array_equal(m[:5, :12], expected)
    assert not m[:5, 12:].any()
    assert not m[5:].any()                               # padded query rows see nothing


def test_active_mask_hand_computed():
    m = active_mask(_plan())
    assert m.shape == (128, 128)
    expected = _bits("10000",
                     "11000",
                     "00100",
                     "00110",
                     "00111")
    np.testing.assert_array_equal(m[:5, :5], expected)
    assert not m[:5, 5:].any() and not m[5:].any()


def test_seq_ids_and_row_ranges_hand_computed():
    p = _plan()
    assert query_seq_ids(p)[:6].tolist() == [0, 0, 1, 1, 1, -1]
    assert context_seq_ids(p)[:13].tolist() == [0, 0, 0, 0, 0, -1, -1, -1, 1, 1, -1, -1, -1]
    start, end = context_row_ranges(p)
    assert start[:6].tolist() == [0, 0, 8, 8, 8, 0]
    assert end[:6].tolist() == [5, 5, 10, 10, 10, 0]


def test_reorder_hand_computed():
    # B=16, LT=512: M=32, Tf=4, b'=4, L=128 (one group). New column s*128 + p holds old p*4 + s.
    # seq0 context tokens: natural 0..4 -> new columns 0, 128, 256, 384, 1
    # seq1 context tokens: natural 16, 17 -> new columns 4, 132
    p = _plan(block_size=16)
    m = build_attention_mask(p)
    assert m.shape == (128, 512 + 128)
    assert np.flatnonzero(m[0, :512]).tolist() == [0, 1, 128, 256, 384]
    assert np.flatnonzero(m[1, :512]).tolist() == [0, 1, 128, 256, 384]
    for r in (2, 3, 4):
        assert np.flatnonzero(m[r, :512]).tolist() == [4, 132]
    np.testing.assert_array_equal(m[:, 512:], active_mask(p))   # active columns untouched


def test_reorder_formula_on_integers():
    # new[:, j*LT + g*128*b' + s*128 + p] = old[:, j*LT + g*128*b' + p*b' + s]; B=1, LT=1024 has
    # b'=1 (identity); B=32, LT=4096 has M=128, Tf=1, b'=32, one group.
    old = np.arange(2 * 4096 + 1)[None, :]                        # Q = 1, two tiles
    new = reorder_context_mask(old, 4096, 32)
    assert new[0, 1 * 4096 + 5 * 128 + 7] == 1 * 4096 + 7 * 32 + 5
    assert new[0, -1] == old[0, -1]
    ident = reorder_context_mask(np.arange(1025)[None, :], 1024, 1)
    np.testing.assert_array_equal(ident, np.arange(1025)[None, :])


def test_context_token_order_is_the_reorder_of_arange():
    order = context_token_order(4096, 2048, 32)
    assert order[:3].tolist() == [0, 16, 32] and order[128] == 1
    assert sorted(order.tolist()) == list(range(4096))


BLOCKS = st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256])
TILES = st.sampled_from([512, 1024, 2048, 4096])


@settings(max_examples=30, deadline=None)
@given(B=BLOCKS, LT=TILES, q=st.integers(1, 6), n_tiles=st.integers(0, 2), seed=st.integers(0, 999))
def test_reorder_inverse_round_trip(B, LT, q, n_tiles, seed):
    rng = np.random.default_rng(seed)
    m = rng.random((q, n_tiles * LT + q)) < 0.5
    r = reorder_context_mask(m, LT, B)
    np.testing.assert_array_equal(inverse_reorder_context_mask(r, LT, B), m)
    np.testing.assert_array_equal(reorder_context_mask(inverse_reorder_context_mask(m, LT, B), LT, B), m)
    np.testing.assert_array_equal(r[:, n_tiles * LT:], m[:, n_tiles * LT:])
    # the reorder is a column permutation within each large tile
    np.testing.assert_array_equal(np.sort(r[:, :n_tiles * LT].reshape(q, n_tiles, LT), axis=-1),
                                  np.sort(m[:, :n_tiles * LT].reshape(q, n_tiles, LT), axis=-1))


@settings(max_examples=40, deadline=None)
@given(B=BLOCKS, LT=TILES,
       lens=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3000)), min_size=1, max_size=5))
def test_build_attention_mask_equals_reorder_of_concat(B, LT, lens):
    qls, cls = zip(*lens)
    p = make_plan(list(qls), list(cls), block_size=B, large_tile_size=LT)
    full = np.concatenate([context_mask(p), active_mask(p)], axis=1)
    built = build_attention_mask(p)
    assert built.dtype == bool and built.shape == (p.padded_queries, p.context_kv_len + p.padded_queries)
    np.testing.assert_array_equal(built, reorder_context_mask(full, LT, B))
    # definition check of the natural masks from the seq ids (independent broadcast form)
    rows, cols = query_seq_ids(p), context_seq_ids(p)
    np.testing.assert_array_equal(full[:, :p.context_kv_len],
                                  (rows[:, None] == cols[None, :]) & (rows[:, None] >= 0))
    # each real row sees exactly its ctx_i context tokens and its causal prefix of new tokens
    counts = built.sum(axis=1)
    pos_in_seq = np.arange(p.num_queries) - np.repeat(p.query_offsets, p.query_lens)
    expect = np.repeat(p.context_lens, p.query_lens) + pos_in_seq + 1
    np.testing.assert_array_equal(counts[:p.num_queries], expect)
    assert not counts[p.num_queries:].any()


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    m = torch.rand(3, 512 + 3) < 0.5
    r = reorder_context_mask(m, 512, 16)
    assert isinstance(r, torch.Tensor) and r.dtype == torch.bool
    assert torch.equal(inverse_reorder_context_mask(r, 512, 16), m)


@pytest.mark.parametrize("mask,LT,B,arg,fragment", [
    (np.zeros(10, bool), 512, 4, "mask", "be 2-D"),
    (np.zeros((3, 515 + 1), bool), 512, 4, "mask", "ctx a multiple of LARGE_TILE_SZ=512"),
    (np.zeros((5, 3), bool), 512, 4, "mask", "(ctx = -2)"),
    (np.zeros((1, 513), bool), 500, 4, "large_tile_size", "power of two"),
    (np.zeros((1, 513), bool), 512, 3, "block_size", "power of two"),
])
def test_reorder_rejects(mask, LT, B, arg, fragment):
    for fn in (reorder_context_mask, inverse_reorder_context_mask):
        with pytest.raises(ValueError, match=f"^{arg} must ") as ei:
            fn(mask, LT, B)
        assert fragment in str(ei.value)


def test_context_token_order_rejects_negative_length():
    with pytest.raises(ValueError, match="^context_kv_len must be >= 0"):
        context_token_order(-1, 512, 4)


def test_build_attention_mask_into_reused_buffer():
    p = _plan(block_size=16)
    buf = np.ones((p.padded_queries, p.context_kv_len + p.padded_queries), dtype=bool)  # stale data
    out = build_attention_mask(p, out=buf)
    assert out is buf
    np.testing.assert_array_equal(out, build_attention_mask(p))


@pytest.mark.parametrize("bad", [
    np.zeros((128, 640), dtype=np.uint8),          # wrong dtype
    np.zeros((128, 641), dtype=bool),              # wrong shape
    [[False]],                                     # not an ndarray
])
def test_build_attention_mask_rejects_bad_out(bad):
    with pytest.raises(ValueError, match=r"^out must be a writable bool NumPy array of shape .* = \(128, 640\); got "):
        build_attention_mask(_plan(block_size=16), out=bad)


def test_build_attention_mask_rejects_read_only_out():
    buf = np.zeros((128, 640), dtype=bool)
    buf.setflags(write=False)
    with pytest.raises(ValueError, match="^out must be a writable"):
        build_attention_mask(_plan(block_size=16), out=buf)
