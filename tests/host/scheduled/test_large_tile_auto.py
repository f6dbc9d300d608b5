"""``large_tile_size="auto"`` (host.scheduled.schedule_items.choose_large_tile, docs/layouts.md
§16.3): which batches get wider large tiles, that the plan carries the resolved size, the
argument checks, and that a decode batch at the auto size still equals the float64 reference
(both targets, with garbage in the cache slots no query may see)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import host
import nki_sim
from host.reference import paged_attention_ref
from host.scheduled.schedule_items import (AUTO_DECODE_MAX_ROWS, AUTO_LARGE_TILE,
                                           choose_large_tile)


@pytest.mark.parametrize("q, G, B, window, want", [
    ([1] * 5, 4, 32, None, 4096),            # single-token decodes, G = 4: 32-token rows
    ([1, 2], 4, 32, None, 4096),             # 8 rows at most
    ([1, 3], 4, 32, None, AUTO_LARGE_TILE),  # 12 rows: a 16-row decode block keeps 2048
    ([1] * 3, 8, 32, None, 4096),            # G = 8, one token: 8 rows
    ([1] * 3, 4, 32, 256, AUTO_LARGE_TILE),  # a sliding window keeps 2048
    ([1] * 3, 4, 16, None, AUTO_LARGE_TILE),  # block 16: 16-token rows already at 2048
    ([1] * 3, 4, 64, None, 4096),            # block 64: 32-token rows
    ([1] * 3, 4, 256, None, 4096),
    ([1] * 3, 4, 8, None, AUTO_LARGE_TILE),
    ([300, 1], 4, 32, None, AUTO_LARGE_TILE),  # a prefill sequence
])
def test_auto_widens_only_single_row_decode_batches(q, G, B, window, want):
    assert choose_large_tile(q, num_queries_per_kv=G, block_size=B, sliding_window=window) == want


def test_auto_falls_back_when_the_wider_tile_does_not_fit():
    seen = []

    def fits(lt):
        seen.append(lt)
        return False

    assert choose_large_tile([1] * 4, num_queries_per_kv=4, block_size=32, sliding_window=None,
                             fits=fits) == AUTO_LARGE_TILE
    assert seen == [4096]
    assert choose_large_tile([1] * 4, num_queries_per_kv=4, block_size=32, sliding_window=None,
                             fits=lambda lt: True) == 4096
    assert AUTO_DECODE_MAX_ROWS == 8


def _plan(q, c, *, B=32, H=8, Hkv=2, d=64, **kw):
    n = -(-np.asarray(c) // B)
    bt = np.full((len(q), max(1, int(n.max()))), -1, np.int32)
    used = 0
    for i, k in enumerate(n.tolist()):
        bt[i, :k] = np.arange(used, used + k)
        used += k
    return host.plan_paged_attention(bt, q, c, num_heads=H, num_kv_heads=Hkv, head_size=d,
                                     block_size=B, num_blocks=max(used, 1), dtype="bfloat16",
                                     backend="sim", **kw)


def test_the_plan_carries_the_resolved_tile():
    assert _plan([1, 1], [5000, 300]).large_tile_size == 4096          # default is "auto"
    assert _plan([1, 1], [5000, 300], large_tile_size=2048).large_tile_size == 2048
    assert _plan([40, 3], [5000, 300]).large_tile_size == 2048       # 160 rows + 12 rows
    assert _plan([1, 1], [5000, 300], sliding_window=64).large_tile_size == 2048
    assert _plan([1, 1], [5000, 300], kernel="dense").large_tile_size == 2048
    # an explicit partial tile larger than the auto choice raises the large tile to it
    assert _plan([40, 3], [5000, 300], partial_tile_size=4096).large_tile_size == 4096
    # a schedule built at the resolved size
    (p,) = _plan([1, 1], [5000, 300]).parts
    assert p.schedule.large_tile_size == 4096 and p.schedule.tiled_block_size == 32


def test_each_class_of_a_mixed_batch_gets_its_own_tiles():
    # a mixed batch: the decode class's auto tile as if it ran alone (4096: 32-token rows), the
    # prefill class's the default; each schedule covers its own sequences only
    plan = _plan([40, 1, 1], [5000, 300, 2000])
    dec, pre = plan.parts
    assert [dec.launch.cls.kind, pre.launch.cls.kind] == ["decode", "prefill"]
    assert (dec.large_tile_size, pre.large_tile_size, plan.large_tile_size) == (4096, 2048, 4096)
    assert dec.kernel_kwargs["options"].LARGE_TILE_SZ == 4096
    assert pre.kernel_kwargs["options"].LARGE_TILE_SZ == 2048
    assert sorted(dec.launch.cls.seqs.tolist()) == [1, 2] and pre.launch.cls.seqs.tolist() == [0]
    assert set(dec.schedule.overlay_seq.tolist()) <= {1, 2}
    assert set(pre.schedule.overlay_seq.tolist()) == {0}
    # an explicit size applies to every class
    plan = _plan([40, 1, 1], [5000, 300, 2000], large_tile_size=1024, partial_tile_size=512)
    assert [(p.large_tile_size, p.partial_tile_size) for p in plan.parts] == [(1024, 512)] * 2


@pytest.mark.parametrize("bad", ["big", "AUTO", 3000, 0, None])
def test_large_tile_size_is_validated(bad):
    with pytest.raises(ValueError, match=r"^large_tile_size must be"):
        _plan([1], [100], large_tile_size=bad)


def _ref_inputs(q_lens, c_lens, *, B, H, Hkv, d, seed):
    rng = np.random.default_rng(seed)
    T = sum(q_lens)
    n = [-(-c // B) for c in c_lens]
    N = sum(n) + 3
    perm = rng.permutation(N)
    bt = np.full((len(q_lens), max(n)), -1, np.int32)
    used = 0
    for i, k in enumerate(n):
        bt[i, :k] = perm[used:used + k]
        used += k
    bf = ml_dtypes.bfloat16
    q = rng.standard_normal((T, H, d)).astype(bf)
    k = rng.standard_normal((T, Hkv, d)).astype(bf)
    v = rng.standard_normal((T, Hkv, d)).astype(bf)
    cache = rng.standard_normal((2, N, Hkv, B, d)).astype(bf)
    return q, k, v, cache, bt


def _garbage_unseen_slots(cache, bt, c_lens, B):
    """NaN in every cache slot no query may see: unused blocks and slots past each context."""
    out = cache.copy()
    used = np.zeros(cache.shape[1], bool)
    for i, c in enumerate(c_lens):
        blocks = bt[i, :-(-c // B)]
        used[blocks] = True
        tail = c % B
        if tail:
            out[:, blocks[-1], :, tail:, :] = np.nan
    out[:, ~used] = np.nan
    return out


@pytest.mark.simulation
@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("q_lens, c_lens, tiles", [
    ([1, 1, 1], [4200, 9000, 700], [4096]),
    ([1, 70, 1], [4200, 900, 700], [4096, 2048]),       # mixed: each class its own tile
], ids=["decode", "mixed"])
def test_auto_tile_batch_matches_the_float64_reference(target, q_lens, c_lens, tiles):
    B, H, Hkv, d = 32, 8, 2, 128
    q, k, v, cache, bt = _ref_inputs(q_lens, c_lens, B=B, H=H, Hkv=Hkv, d=d, seed=3)
    plan = host.plan_paged_attention(bt, q_lens, c_lens, num_heads=H, num_kv_heads=Hkv,
                                     head_size=d, block_size=B, num_blocks=cache.shape[1],
                                     dtype="bfloat16", backend="sim")
    assert [part.large_tile_size for part in plan.parts] == tiles
    dirty = _garbage_unseen_slots(cache, bt, c_lens, B)
    with nki_sim.use_target(target):
        out = np.asarray(host.run_paged_attention(plan, q, k, v, dirty), np.float64)
    want = paged_attention_ref(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                               cache.astype(np.float64), bt, q_lens, c_lens)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, want, atol=3e-3, rtol=0)     # |out| <= 0.21 here
