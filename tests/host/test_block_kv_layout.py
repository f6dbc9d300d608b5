"""vLLM's block-KV layout in the scheduled kernel's inputs (docs/layouts.md §18): the layout
transform and its inverse, the main-cache row ids of both layouts read back through their gather
views (the tokens arrive in the same tile order, so the per-row mask bounds are unchanged), and
the overlay built from a pair equals the one built from the fused cache."""

from __future__ import annotations

import numpy as np
import pytest

from host.cache.block_kv import block_kv_from_fused, cached_tokens, fused_from_block_kv
from host.scheduled.schedule import make_schedule
from host.scheduled.scheduled import build_overlay
from nki_kernels.contract import cache_row_count, main_cache_row

P = 128


def _pair(rng, N, B, Hkv, d):
    vllm = rng.standard_normal((2, N, B, Hkv, d)).astype(np.float32)
    return vllm, (vllm[0], vllm[1])


def test_transform_by_element_and_its_inverse(rng):
    N, B, Hkv, d = 5, 4, 3, 2
    vllm, pair = _pair(rng, N, B, Hkv, d)
    fused = fused_from_block_kv(pair)
    assert fused.shape == (2, N, Hkv, B, d) and fused.flags.c_contiguous
    for kv, n, h, t in zip(*(rng.integers(0, m, 50) for m in (2, N, Hkv, B))):
        assert (fused[kv, n, h, t] == pair[kv][n, t, h]).all()        # the definition
    k, v = block_kv_from_fused(fused)
    assert k.tobytes() == pair[0].tobytes() and v.tobytes() == pair[1].tobytes()
    # the inverse is vLLM's per-layer tensor unbound: K and V consecutive in one buffer
    assert k.base is v.base and v.ctypes.data == k.ctypes.data + k.nbytes
    assert fused_from_block_kv(block_kv_from_fused(fused)).tobytes() == fused.tobytes()
    with pytest.raises(ValueError, match=r"kv_cache must have shape \(2, num_blocks"):
        block_kv_from_fused(fused[0])


def test_cached_tokens_is_the_same_gather_in_both_layouts(rng):
    vllm, pair = _pair(rng, 6, 8, 2, 4)
    fused = np.ascontiguousarray(vllm.transpose(0, 1, 3, 2, 4))
    blk, off = rng.integers(0, 6, 30), rng.integers(0, 8, 30)
    got = cached_tokens(pair, blk, off)
    assert got.shape == (2, 30, 2, 4)
    assert got.tobytes() == cached_tokens(fused, blk, off).tobytes()
    assert (got[1, 7] == vllm[1, blk[7], off[7]]).all()


def test_main_cache_row_formulas():
    # fused (2, N*Hkv*T, b'*d) view: (blk*Hkv + h)*T + t; block-KV (N*T, b'*Hkv*d): blk*T + t
    assert main_cache_row("fused", 5, 1, 2, 3, 4) == (5 * 3 + 2) * 4 + 1
    assert main_cache_row("block_kv", 5, 1, 2, 3, 4) == 5 * 4 + 1
    assert cache_row_count("fused", 7, 3, 4) == 2 * 7 * 3 * 4
    assert cache_row_count("block_kv", 7, 3, 4) == 7 * 4


BATCHES = [   # (query_lens, context_lens, B, LT, LTp, Hkv)
    ([1, 3, 150, 1], [700, 40, 300, 1500], 16, 512, None, 2),
    ([1, 1, 70], [3000, 33, 900], 32, 2048, 512, 3),
    ([200, 1], [1000, 0], 256, 2048, 1024, 1),
]


@pytest.mark.parametrize("q, c, B, LT, LTp, Hkv", BATCHES)
def test_both_layouts_deliver_each_key_at_the_same_tile_position(rng, q, c, B, LT, LTp, Hkv):
    """For every item, load l, partition p and token s of a gathered row, the token the fused
    row id delivers (through the (2, N*Hkv*T, b'*d) view) and the one the block-KV row id
    delivers (through (N*T, b'*Hkv*d), head h at columns h*d + s*Hkv*d) are the same cache
    token, and skipped (sentinel) rows are the same rows. Which position that token is for the
    item is the fused schedule's own test (test_schedule.py, a symbolic run of every column);
    here: only the kv columns differ between the two schedules, so the per-row mask bounds
    (tile-local key indices) hold for both."""
    H, d = 2 * Hkv, 3
    q, c = np.asarray(q), np.asarray(c)
    nb = -(-c // B)
    N = 1 + int(nb.sum()) + 2
    bt = np.full((len(q), int(nb.max()) + 1), -1, np.int64)
    bt[np.arange(bt.shape[1])[None, :] < nb[:, None]] = 1 + rng.permutation(N - 1)[:nb.sum()]
    vllm, pair = _pair(rng, N, B, Hkv, d)
    fused = np.ascontiguousarray(vllm.transpose(0, 1, 3, 2, 4))
    kw = dict(num_heads=H, num_kv_heads=Hkv, head_size=d, block_size=B, num_blocks=N,
              large_tile_size=LT, partial_tile_size=LTp)
    sf = make_schedule(q, c, bt, **kw)
    sb = make_schedule(q, c, bt, kv_layout="block_kv", **kw)
    assert (sf.kv_layout, sb.kv_layout) == ("fused", "block_kv")
    checked = 0
    for cf, cb in zip(sf.classes, sb.classes):
        for pf, pb, masked in ((cf.full, cb.full, False), (cf.partial, cb.partial, True)):
            geo_b = sf.partial_tiled_block_size if masked else sf.tiled_block_size
            T = B // geo_b
            if not pf.items:
                continue
            ki = pf.meta_i.shape[2] // pf.items
            nL = (sf.partial_loads if masked else sf.loads)
            mif = pf.meta_i.reshape(Hkv, P, pf.items, ki)
            mib = pb.meta_i.reshape(Hkv, P, pb.items, ki)
            rest = np.ones(ki, bool)
            rest[:nL] = False
            assert (mif[..., rest] == mib[..., rest]).all()
            assert pf.meta_f.tobytes() == pb.meta_f.tobytes()
            f_ids, b_ids = mif[..., :nL].astype(np.int64), mib[..., :nL].astype(np.int64)
            f_in = f_ids < cache_row_count("fused", N, Hkv, T)
            b_in = b_ids < cache_row_count("block_kv", N, Hkv, T)
            assert (f_in == b_in).all()
            h = np.broadcast_to(np.arange(Hkv)[:, None, None, None], f_ids.shape)[f_in]
            rows_f = fused[0].reshape(N * Hkv * T, geo_b, d)[f_ids[f_in]]        # (n, b', d)
            rows_b = pair[0].reshape(N * T, geo_b, Hkv, d)[b_ids[b_in], :, h]     # (n, b', d)
            assert rows_b.tobytes() == rows_f.tobytes()
            # the definition: fused row (blk*Hkv + h)*T + t holds tokens t*b' .. of block blk
            blk, t = b_ids[b_in] // T, b_ids[b_in] % T
            tok = t[:, None] * geo_b + np.arange(geo_b)[None, :]
            assert rows_b.tobytes() == pair[0][blk[:, None], tok, h[:, None]].tobytes()
            checked += int(f_in.sum())
    assert checked > 0


def test_overlay_from_a_pair_equals_the_overlay_from_the_fused_cache(rng):
    q, c, B, Hkv, d = np.array([1, 3, 150]), np.array([70, 40, 300]), 16, 2, 8
    nb = -(-c // B)
    N = int(nb.sum()) + 3
    bt = np.full((3, int(nb.max())), -1, np.int64)
    bt[np.arange(bt.shape[1])[None, :] < nb[:, None]] = rng.permutation(N)[:nb.sum()]
    vllm, pair = _pair(rng, N, B, Hkv, d)
    fused = np.ascontiguousarray(vllm.transpose(0, 1, 3, 2, 4))
    key = rng.standard_normal((int(q.sum()), Hkv, d)).astype(np.float32)
    s = make_schedule(q, c, bt, num_heads=4, num_kv_heads=Hkv, head_size=d, block_size=B,
                      num_blocks=N, large_tile_size=512, kv_layout="block_kv")
    a = build_overlay(s, pair, key, key, bt)
    assert a.tobytes() == build_overlay(s, fused, key, key, bt).tobytes()
    assert np.abs(a).max() > 0
