"""The MLA kernel's host-side layouts (docs/layouts.md §17): the overlay rows, their inverse
through gather_mla_entries, and the gathered cache rows named by the schedule metadata."""

from __future__ import annotations

import numpy as np
import pytest

from host import check_mla_inputs, gather_mla_entries
from host.mla.mla_attention import build_mla_overlay, mla_schedule

R, P = 24, 8            # small latent sizes: the layouts do not depend on them
D = R + P


def _batch(seed, qlens, clens, *, B, E, N_spare=3):
    rng = np.random.default_rng(seed)
    nblk = -(-np.asarray(clens) // B)
    N = int(nblk.sum()) + N_spare
    perm = rng.permutation(N)
    bt = np.full((len(qlens), int(nblk.max()) + 2), -1, np.int64)
    off = 0
    for i, n in enumerate(nblk.tolist()):
        bt[i, :n] = perm[off:off + n]
        off += n
    cache = rng.uniform(-1, 1, (N, B, E)).astype(np.float32)   # padding and tails non-zero too
    q = np.zeros((int(sum(qlens)), 4, D), np.float32)
    return q, cache, bt, np.asarray(qlens), np.asarray(clens)


@pytest.mark.parametrize("B, E", [(16, D), (64, D + 8)])
def test_overlay_rows_and_their_inverse(B, E):
    """Overlay rows are the key rows from ``(context - query) // b'`` to ``ceil(context / b')``
    of each sequence; entry s of a row is the cache entry of its position (elements [0, R + P))
    while the position is cached, else zero, and entry padding is always zero. Reading the same
    slots back with gather_mla_entries gives the overlay's kv_c and k_pe."""
    q, cache, bt, ql, cl = _batch(0, [1, 5, 3, 1], [9, 70, 3, 64], B=B, E=E)
    plan = check_mla_inputs(q, cache, bt, ql, cl, kv_lora_rank=R, qk_rope_head_dim=P)
    sched = mla_schedule(plan, bt, 512, 8)
    bp = sched.tiled_block_size
    ov = build_mla_overlay(sched, cache, bt, D).reshape(-1, bp, E)
    expect_rows = [(i, j) for i in range(len(ql))
                   for j in range((cl[i] - ql[i]) // bp, -(-cl[i] // bp))]
    assert list(zip(sched.overlay_seq.tolist(), (sched.overlay_pos0 // bp).tolist())) == expect_rows
    slots, cells = [], []
    for r, (i, j) in enumerate(expect_rows):
        for s in range(bp):
            pos = j * bp + s
            assert not ov[r, s, D:].any()
            if pos < cl[i]:
                blk = bt[i, pos // B]
                np.testing.assert_array_equal(ov[r, s, :D], cache[blk, pos % B, :D])
                slots.append(blk * B + pos % B)
                cells.append(ov[r, s])
            else:
                assert not ov[r, s].any()
    kv_c, k_pe = gather_mla_entries(cache, np.array(slots), kv_lora_rank=R, qk_rope_head_dim=P)
    np.testing.assert_array_equal(kv_c, np.array(cells)[:, :R])
    np.testing.assert_array_equal(k_pe, np.array(cells)[:, R:D])


def test_schedule_rows_name_whole_cache_rows_of_the_flat_view():
    """Main-cache row ids of every real item index the flat view (N * T, b' * E): row
    ``blk * T + sub`` = entries ``[sub * b', (sub + 1) * b')`` of block blk, and they are exactly
    the sequence's key rows below ``(context - query) // b'`` in tile order."""
    B, E = 32, D + 8
    q, cache, bt, ql, cl = _batch(1, [1, 1, 2], [600, 33, 530], B=B, E=E)
    plan = check_mla_inputs(q, cache, bt, ql, cl, kv_lora_rank=R, qk_rope_head_dim=P)
    sched = mla_schedule(plan, bt, 512, 8)
    T, bp, nL = sched.tiling_factor, sched.tiled_block_size, sched.loads
    flat = cache.reshape(cache.shape[0] * T, bp * E)
    blk, sub = 5, T - 1
    np.testing.assert_array_equal(flat[blk * T + sub], cache[blk, sub * bp:(sub + 1) * bp].reshape(-1))
    seen = {i: [] for i in range(len(ql))}
    for cls in sched.classes:
        seq_of_block = np.repeat(cls.seqs, [-(-int(ql[i] * 4) // cls.rows) for i in cls.seqs])
        for ph in (cls.partial, cls.full):
            ki = ph.meta_i.shape[2] // ph.items
            mi = ph.meta_i[0].reshape(128, ph.items, ki)
            for t in range(ph.real_items):
                rows = mi[:, t, :nL].T.reshape(-1)
                seen[int(seq_of_block[ph.item_block[t]])].extend(rows[rows < flat.shape[0]].tolist())
    for i in range(len(ql)):
        n_main = (cl[i] - ql[i]) // bp
        j = np.arange(n_main)
        want = bt[i, j // T] * T + j % T
        assert sorted(seen[i]) == sorted(want.tolist())
