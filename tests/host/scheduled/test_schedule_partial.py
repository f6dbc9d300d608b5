"""The partial phase's own tile geometry (docs/layouts.md §16.3): partial tiles of LTp keys cut
from the large tiles that are not full, pruned when nobody sees them, and the ``"auto"`` choice
of LTp. Coverage (every visible pair exactly once) is checked with the symbolic model of
``test_schedule.py``, which decodes each phase in its own geometry."""

from __future__ import annotations

import numpy as np
import pytest

from host.scheduled.schedule import ITEM_OVERHEAD_KEYS, make_schedule
from host.scheduled.schedule_items import DECODE_ITEM_OVERHEAD_KEYS, MASKED_KEY_WEIGHT
from symbolic_schedule import check_coverage, schedule, summary


def test_decode_end_is_one_small_partial_tile():
    # c = 4096, one new token, B = 32, LT = 2048 (b' = 16), LTp = 512 (b'_p = 4): large tiles 0
    # and 1 are full; the new token's large tile 2 is cut into partial tiles 8..11 of 512 keys
    # and only tile 8 (keys 4096..4607) holds a key
    s, kw = schedule([1], [4096], H=8, Hkv=2, d=16, B=32, LT=2048, LTp=512)
    items = summary(check_coverage(s, **kw)[0])
    assert [(ph, tile) for ph, _, tile, *_ in items] == [("f", 0), ("f", 1), ("p", 8)]
    assert (s.partial_tiled_block_size, s.partial_tiling_factor, s.partial_loads) == (4, 8, 1)
    assert s.overlay_pos0.tolist() == [4096]          # one overlay row of b'_p = 4 positions


def test_partial_tiles_nobody_sees_are_pruned():
    # K = 5001: large tile 2 (4096..6143) is partial; of its partial tiles 8..11 only 8 and 9
    # (4608..5119, holding keys up to 5000) exist; tile 9 (keys 4608..5000) writes fewer rows
    # than tile 8, so it comes first (the items' written rows then nest)
    s, kw = schedule([1], [5000], H=2, Hkv=1, d=16, B=32, LT=2048, LTp=512)
    items = summary(check_coverage(s, **kw)[0])
    assert [tile for ph, _, tile, *_ in items if ph == "p"] == [9, 8]


def test_prefill_diagonal_is_cut_to_partial_tiles():
    # 300 new tokens on 1900 cached (G = 1: one group of three 128-row blocks, positions
    # 1900..2199, K = 2200): large tile 0 holds new tokens (not full) -> partial tiles 0..3;
    # large tile 1 (2048..4095) -> partial tile 4 only (tile 5 starts past the last key)
    s, kw = schedule([300], [1900], H=1, Hkv=1, d=16, B=16, LT=2048, LTp=512)
    items = summary(check_coverage(s, **kw)[0])
    part = sorted({tile for ph, _, tile, *_ in items if ph == "p"})
    assert part == [0, 1, 2, 3, 4]                  # keys 0..2199: large tile 0 and 1's tile 4
    full = [tile for ph, _, tile, *_ in items if ph == "f"]
    assert full == []                              # no 128-row block sees all of tile 0


@pytest.mark.parametrize("ltp", [512, 1024, 2048])
def test_every_partial_tile_size_covers_every_visible_pair(ltp):
    q, c = [1, 3, 40, 2, 200], [4095, 4096, 2500, 0, 7000]
    s, kw = schedule(q, c, H=4, Hkv=2, d=16, B=16, LT=2048, LTp=ltp, window=3000)
    check_coverage(s, **kw)


def _cost(q, c, *, B, LT, ltp, window=None, overhead=DECODE_ITEM_OVERHEAD_KEYS):
    """Cost of the partial items of a decode-only batch (one Q block per group) from the fixed
    size schedule: items * (LTp keys + the decode class's per-item overhead)."""
    s, _ = schedule(q, c, H=2, Hkv=1, d=16, B=B, LT=LT, LTp=ltp, window=window)
    assert [cls.kind for cls in s.classes] == ["decode"]
    W = 128 * s.partial_loads * s.partial_tiled_block_size
    return sum(cls.partial.real_items for cls in s.classes) * (W + overhead)


DEMO_DECODES = ([1] * 7, [2048, 1800, 3000, 900, 2500, 1200, 4096])   # the nki-pa demo's


@pytest.mark.parametrize("q, c, window, want", [
    ([1, 1], [4096, 8192], None, 512),        # every decode's end tile holds one key
    ([1], [32768], 4096, 2048),               # the window's lower edge sees a whole large tile
    ([1] * 4, [1000, 3000, 5000, 7000], None, 1024),
    (*DEMO_DECODES, None, 1024),
])
def test_auto_picks_the_cheapest_partial_tile(q, c, window, want):
    costs = {ltp: _cost(q, c, B=32, LT=2048, ltp=ltp, window=window) for ltp in (512, 1024, 2048)}
    assert min(costs, key=lambda k: (costs[k], k)) == want
    s, kw = schedule(q, c, H=2, Hkv=1, d=16, B=32, LT=2048, LTp="auto", window=window)
    assert s.partial_tile_size == want
    check_coverage(s, **kw)


def test_decode_items_weigh_less_fixed_work_than_query_rows_groups():
    # must-fail twin: at the query-rows classes' per-item overhead the demo's decodes would take
    # 2048-key partial tiles (slower under the cost model: docs/layouts.md 16.3)
    assert DECODE_ITEM_OVERHEAD_KEYS < ITEM_OVERHEAD_KEYS
    costs = {ltp: _cost(*DEMO_DECODES, B=32, LT=2048, ltp=ltp, overhead=ITEM_OVERHEAD_KEYS)
             for ltp in (512, 1024, 2048)}
    assert min(costs, key=lambda k: (costs[k], k)) == 2048


def test_auto_with_large_tile_512_is_512():
    s, _ = schedule([1], [100], H=2, Hkv=1, d=16, B=16, LT=512, LTp="auto")
    assert s.partial_tile_size == 512


@pytest.mark.parametrize("bad", [256, 1000, 4096, "small", 0])
def test_partial_tile_size_is_validated(bad):
    with pytest.raises(ValueError, match="partial_tile_size"):
        make_schedule(np.array([1]), np.array([10]), np.zeros((1, 1), np.int32), num_heads=1,
                      num_kv_heads=1, head_size=16, block_size=16, num_blocks=1,
                      large_tile_size=2048, partial_tile_size=bad)


@pytest.mark.parametrize("q, c, want_blocks, want_ltp", [
    ([2048], [2048], 32, 1024),     # a long causal diagonal: two groups, 1024-key partial tiles
    ([512], [8192], 16, 512),       # little diagonal, much context: one group (re-reads cost)
])
def test_auto_halves_prefill_groups_where_the_diagonal_pays(q, c, want_blocks, want_ltp):
    # G = 4 query heads per KV head: 2048 new tokens are 8192 query rows = 64 Q blocks, one
    # group as large as SBUF allows; halved, a group's partial items skip the partial tiles of
    # the diagonal that it does not see (98304 masked block-keys instead of 131072) and each
    # full tile is read twice (2 more items)
    s, kw = schedule(q, c, H=4, Hkv=1, d=16, B=32, LT=2048, LTp="auto")
    check_coverage(s, **kw)
    (cls,) = s.classes
    assert (cls.blocks, s.partial_tile_size) == (want_blocks, want_ltp)


def test_auto_group_choice_is_the_cheapest_option():
    # the cost "auto" minimises, recomputed from fixed-size schedules: every (group cap, LTp)
    # pair it may try for a 2048-on-2048 prefill (G = 4; 64 blocks fit one group)
    from host.scheduled.schedule_items import MIN_AUTO_GROUP_BLOCKS

    q, c = [2048], [2048]
    costs = {}
    blocks = 64
    while blocks >= MIN_AUTO_GROUP_BLOCKS:
        for ltp in (512, 1024, 2048):
            s, _ = schedule(q, c, H=4, Hkv=1, d=16, B=32, LT=2048, LTp=ltp, cap=blocks)
            (cls,) = s.classes
            W = {False: 2048, True: ltp}
            cost = 0
            for ph in (cls.full, cls.partial):
                n = ph.real_items
                weight = MASKED_KEY_WEIGHT if ph.masked else 1.0
                cost += n * (weight * cls.blocks * W[ph.masked] + ITEM_OVERHEAD_KEYS)
            costs[(blocks, ltp)] = cost
        blocks //= 2
    s, _ = schedule(q, c, H=4, Hkv=1, d=16, B=32, LT=2048, LTp="auto")
    (cls,) = s.classes
    best = min(costs.values())
    assert costs[(cls.blocks, s.partial_tile_size)] == best
    assert costs[(64, 2048)] > best           # the one large group is not the cheapest here


@pytest.mark.parametrize("weight, blocks, ltp", [(MASKED_KEY_WEIGHT, 16, 512), (1.0, 32, 1024)])
def test_masked_keys_weigh_more_in_the_auto_choice(weight, blocks, ltp, monkeypatch):
    """A causal-only prefill (1K new tokens x G = 4, no context) at the benchmark's geometry:
    with masked keys weighted, "auto" halves the 32-block groups and picks 512-key partial
    tiles (the faster choice under the cost model); weighted like full keys it keeps them."""
    import host.scheduled.schedule_items as items

    monkeypatch.setattr(items, "MASKED_KEY_WEIGHT", weight)
    s, kw = schedule([1024], [0], H=32, Hkv=8, d=128, B=32, LT=2048, LTp="auto")
    (cls,) = s.classes
    assert (cls.blocks, s.partial_tile_size) == (blocks, ltp)
    check_coverage(s, **kw)

