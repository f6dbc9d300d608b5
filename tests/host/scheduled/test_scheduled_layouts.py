"""host/scheduled/scheduled.py layout transforms (docs/layouts.md §16.1, §16.2) and their inverses:
Q^T packing / output unpacking round trip, the key rows (main-cache rows + overlay rows)
reassembled per sequence equal the key sequence of the definition, and the per-row init values
(q_init) read back by (token, head)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from host.scheduled.schedule import make_schedule
from host.scheduled.scheduled import (block_major, build_overlay, group_major, item_queries,
                                     item_row_init, pack_queries, row_init, unpack_output)
from nki_kernels.constants import M_FLOOR

P = 128


def _batch(q, c, *, H, Hkv, d, B, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q, c = np.asarray(q, np.int64), np.asarray(c, np.int64)
    nb = -(-c // B)
    N = int(nb.sum()) + 2
    perm = rng.permutation(N)
    bt = np.full((len(q), int(nb.max()) + 1), -1, np.int64)
    off = 0
    for i, n in enumerate(nb):
        bt[i, :n] = perm[off:off + n]
        off += n
    T = int(q.sum())
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32).astype(dtype)  # noqa: E731
    return dict(q=q, c=c, bt=bt, N=N, query=u(T, H, d), key=u(T, Hkv, d), value=u(T, Hkv, d),
                cache=u(2, N, Hkv, B, d))


def _schedule(b, LT, LTp=None):
    T, H, d = b["query"].shape
    _, N, Hkv, B, _ = b["cache"].shape
    return make_schedule(b["q"], b["c"], b["bt"], num_heads=H, num_kv_heads=Hkv, head_size=d,
                         block_size=B, num_blocks=N, large_tile_size=LT, partial_tile_size=LTp)


def check_pack_round_trip(b, LT, tamper=lambda qt: qt):
    query = b["query"]
    T, H, d = query.shape
    Hkv = b["cache"].shape[2]
    G = H // Hkv
    s = _schedule(b, LT)
    result = np.zeros_like(query)
    for cls in s.classes:
        nblk, rows, blocks = cls.num_blocks, cls.rows, cls.blocks
        ngroups = nblk // blocks
        assert ngroups * blocks == nblk                               # whole groups
        qt = tamper(pack_queries(cls, query, Hkv))
        assert qt.shape == (Hkv * ngroups * d, blocks * rows) and qt.dtype == query.dtype
        # §16.2, group-major: row (h*ngroups + g)*d + ch, column j*rows + p = query[token,
        # h*G + g', ch] of query row p of Q block b = g*blocks + j; 0 for padding rows
        tok, g = cls.row_token.reshape(nblk, rows), cls.row_head.reshape(nblk, rows)
        out = np.zeros((Hkv * ngroups * rows, blocks * d), query.dtype)
        for h in range(Hkv):
            for blk in range(nblk):
                gi, j = divmod(blk, blocks)
                real = tok[blk] >= 0
                want = np.zeros((d, rows), query.dtype)
                want[:, real] = query[tok[blk, real], h * G + g[blk, real]].T
                r0 = (h * ngroups + gi) * d
                got = qt[r0:r0 + d, j * rows:(j + 1) * rows]
                assert got.tobytes() == want.tobytes()
                # inverse: output row (h*ngroups + g)*rows + p, columns [j*d, (j+1)*d) = Q^T
                # column j*rows + p of the group's rows, head h
                o0 = (h * ngroups + gi) * rows
                out[o0:o0 + rows, j * d:(j + 1) * d] = got.T
        unpack_output(cls, out, result)
    assert result.tobytes() == query.tobytes()                    # every (token, head) once


def check_key_rows(b, LT, tamper=lambda ov: ov, LTp=None):
    """Main rows then overlay rows, in the partial phase's geometry (the overlay's rows)."""
    cache, key, value, bt = b["cache"], b["key"], b["value"], b["bt"]
    _, N, Hkv, B, d = cache.shape
    s = _schedule(b, LT, LTp)
    bp, Tf = s.partial_tiled_block_size, s.partial_tiling_factor
    assert Tf * bp == B
    ov = tamper(build_overlay(s, cache, key, value, bt))
    R_ov = len(s.overlay_seq)
    assert ov.shape == (2, Hkv * max(R_ov, 1), bp * d) and ov.dtype == cache.dtype
    flat = cache.reshape(2, N * Hkv * Tf, bp * d)                  # §5 view C3
    tok_off = np.concatenate(([0], np.cumsum(b["q"])))
    o_i = 0
    for i, (qn, cn) in enumerate(zip(b["q"], b["c"])):
        K = cn + qn
        m, n = cn // bp, -(-K // bp)
        assert s.overlay_seq[o_i:o_i + n - m].tolist() == [i] * (n - m)
        assert s.overlay_pos0[o_i:o_i + n - m].tolist() == [j * bp for j in range(m, n)]
        for h in range(Hkv):
            main = [flat[:, (bt[i, j // Tf] * Hkv + h) * Tf + j % Tf] for j in range(m)]
            over = [ov[:, h * max(R_ov, 1) + o_i + (j - m)] for j in range(m, n)]
            rows = np.stack(main + over, axis=1).reshape(2, n * bp, d)
            # the definition: context token x is kv_cache[:, bt[i, x // B], h, x % B], then the
            # new tokens' key / value; nothing after position K - 1 but zeros
            ctx = np.stack([cache[:, bt[i, x // B], h, x % B] for x in range(cn)] or
                           [np.zeros((2, d), cache.dtype)], axis=1)[:, :cn]
            new = np.stack([key[tok_off[i]:tok_off[i] + qn, h], value[tok_off[i]:tok_off[i] + qn, h]])
            want = np.concatenate([ctx, new.astype(cache.dtype)], axis=1)
            assert rows[:, :K].tobytes() == want.tobytes()
            assert not rows[:, K:].astype(np.float32).any()
        o_i += n - m
    assert o_i == R_ov


CASES = [  # (q, c, H, Hkv, d, B, LT, LTp)
    ([1, 3, 40, 150], [1000, 509, 0, 600], 4, 2, 8, 16, 512, None),   # decode + prefill classes
    ([2, 5, 1, 7], [9, 0, 64, 8], 1, 1, 4, 8, 512, None),              # b' = 4 with partial rows
    ([1, 1], [300, 0], 2, 2, 4, 256, 2048, None),                       # Tf = 16
    ([33, 1], [5, 7], 8, 1, 3, 1, 8192, None),                          # b' = 1 (no overlay tails)
    ([70], [4095], 6, 2, 130, 32, 8192, None),                          # d > 128, L = 256 (nL = 2)
    ([1, 3, 40], [1000, 509, 33], 4, 2, 8, 32, 2048, 512),             # b'_p = 4 (b' = 16)
    ([70, 1], [4095, 9], 6, 2, 130, 32, 8192, 1024),                   # b'_p = 8 (b' = 64)
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["fp32", "bf16"])
def test_layouts_round_trip(case, dtype):
    q, c, H, Hkv, d, B, LT, LTp = case
    b = _batch(q, c, H=H, Hkv=Hkv, d=d, B=B, seed=len(q), dtype=dtype)
    check_pack_round_trip(b, LT)
    check_key_rows(b, LT, LTp=LTp)


def test_group_major_inverse():
    # block_major undoes group_major (NumPy and torch), and element (h, b, i, e) lands at row
    # (h*ngroups + g)*a + i, column j*b + e for b = g*blocks + j
    rng = np.random.default_rng(7)
    Hkv, ngroups, blocks, a, bw = 2, 3, 4, 5, 6
    x = rng.standard_normal((Hkv, ngroups * blocks, a, bw)).astype(np.float32)
    y = group_major(x, blocks)
    assert y.shape == (Hkv * ngroups * a, blocks * bw)
    for h, blk, i, e in [(0, 0, 0, 0), (1, 7, 2, 3), (1, 11, 4, 5), (0, 5, 1, 0)]:
        g, j = divmod(blk, blocks)
        assert y[(h * ngroups + g) * a + i, j * bw + e] == x[h, blk, i, e]
    assert np.array_equal(block_major(y, Hkv, blocks, a, bw), x)
    assert np.array_equal(group_major(x, 1), x.reshape(Hkv * ngroups * blocks * a, bw))
    torch = pytest.importorskip("torch")
    yt = group_major(torch.from_numpy(x), blocks)
    assert np.array_equal(yt.numpy(), y)
    assert np.array_equal(block_major(yt, Hkv, blocks, a, bw).numpy(), x)


def test_checks_can_fail():
    # must-fail: two query rows swapped, two overlay rows swapped, one overlay element changed
    b = _batch([3, 2], [10, 5], H=2, Hkv=1, d=4, B=8, seed=0)
    check_pack_round_trip(b, 512)
    check_key_rows(b, 512)
    with pytest.raises(AssertionError):
        check_pack_round_trip(b, 512, tamper=lambda qt: qt[:, [1, 0] + list(range(2, qt.shape[1]))])
    with pytest.raises(AssertionError):
        check_key_rows(b, 512, tamper=lambda ov: ov[:, [1, 0] + list(range(2, ov.shape[1]))])

    def bump(ov):
        ov = ov.copy()
        ov[1, 0, 0] += 1
        return ov

    with pytest.raises(AssertionError):
        check_key_rows(b, 512, tamper=bump)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(lens=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 700)), min_size=1, max_size=5),
       B=st.sampled_from([1, 2, 4, 16, 64, 256]), LT=st.sampled_from([512, 2048, 8192]),
       heads=st.sampled_from([(1, 1), (4, 2), (8, 1), (3, 3)]), d=st.sampled_from([1, 5, 129]),
       seed=st.integers(0, 1000), ltp=st.sampled_from([None, 512, "auto"]))
def test_layouts_round_trip_random(lens, B, LT, heads, d, seed, ltp):
    q, c = zip(*lens)
    b = _batch(q, c, H=heads[0], Hkv=heads[1], d=d, B=B, seed=seed)
    check_pack_round_trip(b, LT)
    check_key_rows(b, LT, LTp=ltp)


@pytest.mark.parametrize("sinks, alibi", [(False, False), (True, False), (False, True), (True, True)])
def test_row_init_values_by_token_and_head(sinks, alibi):
    # q_init row (h*ngroups + g)*rows + p, columns [j*4, j*4 + 4) = [-m0, l0, slope,
    # slope * position] of query row p of Q block g*blocks + j
    q, c, H, Hkv = [1, 3, 40], [10, 0, 7], 6, 2
    G = H // Hkv
    b = _batch(q, c, H=H, Hkv=Hkv, d=4, B=16, seed=3)
    sink = np.linspace(-1.0, 2.0, H).astype(np.float32) if sinks else None
    slope = np.linspace(0.5, 0.01, H).astype(np.float32) if alibi else None
    qoff = np.concatenate(([0], np.cumsum(q)))
    seen = np.zeros((int(sum(q)), H), int)
    for cls in _schedule(b, 512).classes:
        init = row_init(cls, H, Hkv, sinks=sink, alibi_slopes=slope)
        nblk, rows, blocks = cls.num_blocks, cls.rows, cls.blocks
        ngroups = nblk // blocks
        assert init.shape == (Hkv * ngroups * rows, blocks * 4) and init.dtype == np.float32
        for h in range(Hkv):
            for r in range(nblk * rows):
                (gi, j), p = divmod(r // rows, blocks), r % rows     # block g*blocks + j, row p
                row = init[(h * ngroups + gi) * rows + p, j * 4:(j + 1) * 4]
                tok, g = cls.row_token[r], cls.row_head[r]
                if tok < 0:
                    assert row.tolist() == np.array([-M_FLOOR, 0, 0, 0], np.float32).tolist()
                    continue
                i = int(np.searchsorted(qoff, tok, side="right")) - 1
                pos = c[i] + tok - qoff[i]                     # absolute query position
                hq = h * G + g
                m0, l0 = (-sink[hq], 1.0) if sinks else (-M_FLOOR, 0.0)
                sl = slope[hq] if alibi else 0.0
                assert row.tolist() == np.array([m0, l0, sl, sl * pos], np.float32).tolist()
                seen[tok, hq] += 1
    assert np.all(seen == 1)


@pytest.mark.parametrize("LT, LTp", [(512, None), (2048, 512)])
def test_per_item_preloads_read_back_by_item(LT, LTp):
    # keys on partitions: column block t of item_queries / item_row_init is the Q^T block /
    # the q_init rows of item t's Q block (zeros / -M_FLOOR, 0, 0, 0 for padding items)
    q, c, H, Hkv = [1, 2, 1], [700, 33, 4096], 8, 2
    b = _batch(q, c, H=H, Hkv=Hkv, d=8, B=16, seed=5)
    s = _schedule(b, LT, LTp)
    slope = np.linspace(0.5, 0.01, H).astype(np.float32)
    sink = np.linspace(-1.0, 2.0, H).astype(np.float32)
    (cls,) = s.classes
    assert cls.decode_layout
    rows, nblk, d = cls.rows, cls.num_blocks, 8
    qt = pack_queries(cls, b["query"], Hkv)
    init = row_init(cls, H, Hkv, sinks=sink, alibi_slopes=slope)
    for phase in (cls.full, cls.partial):
        iq = item_queries(cls, qt, phase, Hkv)
        ii = item_row_init(cls, init, phase, Hkv)
        assert iq.shape == (Hkv * d, phase.items * rows) and iq.dtype == qt.dtype
        assert ii.shape == (Hkv * rows, phase.items * 4) and ii.dtype == np.float32
        for t, blk in enumerate(phase.item_block):
            for h in range(Hkv):
                got_q = iq[h * d:(h + 1) * d, t * rows:(t + 1) * rows]
                got_i = ii[h * rows:(h + 1) * rows, t * 4:(t + 1) * 4]
                if blk < 0:
                    assert not got_q.astype(np.float32).any()
                    assert (got_i == np.array([-M_FLOOR, 0, 0, 0], np.float32)).all()
                    continue
                assert got_q.tobytes() == qt[(h * nblk + blk) * d:(h * nblk + blk + 1) * d].tobytes()
                r0 = (h * nblk + blk) * rows
                assert got_i.tobytes() == init[r0:r0 + rows].tobytes()
        assert (phase.item_block[:phase.real_items] >= 0).all()
