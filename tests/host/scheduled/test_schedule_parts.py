"""A class's items cut in item parts, one per physical core of an LNC=2 launch (docs/layouts.md
§16.3): whole groups per part, the groups dealt out by work, each part padded to the same
static count, and the symbolic launch of symbolic_schedule.py still folding every visible
(query row, key) pair exactly once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from host.scheduled.schedule import bucket
from host.scheduled.schedule_items import fill_partial_padding, group_blocks_for_parts, split_parts
from symbolic_schedule import check_coverage, schedule


def _groups(items):
    return {g for g, _ in items}


def test_split_parts_deals_whole_groups_by_work():
    # group: (full items, partial items): 0: (3, 1), 1: (0, 1), 2: (1, 1), 3: (2, 1), 4: (0, 2)
    full = [(0, 0), (0, 1), (0, 2), (2, 0), (3, 0), (3, 1)]
    part = [(0, 12), (1, 0), (2, 4), (3, 8), (4, 0), (4, 1)]
    # every tile whole (each sequence has 10**6 keys): full items 8 + 2, partial 1 + 2
    cut = split_parts(full, part, 2, group_keys=[10 ** 6] * 5, widths=(8, 1), overhead=2,
                      per_tile=4)
    # work 33, 3, 13, 23, 6, largest first, each to the lighter part: 0 -> part 0 (33, 0),
    # 3 -> 1 (33, 23), 2 -> 1 (33, 36), 4 -> 0 (39, 36), 1 -> 1 (39, 39)
    owner = {g: p for p, (f, pi) in enumerate(cut) for g in _groups(f) | _groups(pi)}
    assert owner == {0: 0, 3: 1, 2: 1, 4: 0, 1: 1}
    for p, (f, pi) in enumerate(cut):
        mine = {g for g, q in owner.items() if q == p}
        want_f = [it for it in full if it[0] in mine]
        want_p = [it for it in part if it[0] in mine]
        assert (f, pi) == fill_partial_padding(want_f, want_p, 4)      # order kept, then filled
    assert split_parts(full, part, 1, group_keys=[1] * 5, widths=(8, 1), overhead=2,
                       per_tile=4) == (fill_partial_padding(full, part, 4),)


def test_split_parts_with_fewer_groups_than_parts_leaves_a_part_empty():
    cut = split_parts([(0, 0)], [(0, 4)], 2, group_keys=[100], widths=(8, 2), overhead=1,
                      per_tile=4)
    assert cut[1] == ([], []) and _groups(cut[0][0]) | _groups(cut[0][1]) == {0}


def _part_rows(arr):
    """(parts, items per part) Q block of every item (-1: padding)."""
    return arr.item_block.reshape(arr.parts, arr.items // arr.parts)


@pytest.mark.parametrize("q, c, Hkv", [([1] * 7, [300, 2000, 90, 700, 5000, 40, 1200], 1),
                                      ([40, 1, 300, 1], [600, 900, 0, 100], 3)])
def test_two_parts_cover_every_pair_once_with_disjoint_groups(q, c, Hkv):
    s, kw = schedule(q, c, H=4 * Hkv, Hkv=Hkv, d=32, B=16, LT=512, LTp="auto", parts=2)
    check_coverage(s, **kw)
    for cls in s.classes:
        _check_parts(cls)


def _check_parts(cls):
    """Each phase: 2 parts of bucket(the larger part's real items) items, real items first;
    a group's items (full and partial) all in one part."""
    assert cls.item_parts == 2
    owners = []
    for arr in (cls.full, cls.partial):
        assert arr.parts == 2 and arr.items % 2 == 0
        rows = _part_rows(arr)
        real = [int((r >= 0).sum()) for r in rows]
        assert rows.shape[1] == bucket(max(real)) and sum(real) == arr.real_items
        for r, k in zip(rows, real):            # a part's real items first, then padding
            assert (r[:k] >= 0).all() and (r[k:] < 0).all()
        owners.append([set((r[r >= 0] // cls.blocks).tolist()) for r in rows])
    groups = [owners[0][p] | owners[1][p] for p in range(2)]
    assert not groups[0] & groups[1], "a group in both parts"


@pytest.mark.parametrize("need, cap, parts, blocks", [
    ([64], 32, 1, 32), ([64], 32, 2, 16),      # 2 groups of 32 -> 4 of 16
    ([12, 8], 32, 2, 6),                       # 2 + 2 groups of 6 blocks
    ([3], 8, 2, 1), ([5, 5, 5, 5], 8, 2, 3),   # halved to 1 block; already 8 groups of 3
])
def test_group_blocks_for_parts(need, cap, parts, blocks):
    assert group_blocks_for_parts(need, cap, parts) == blocks


def test_a_prefill_sequence_gets_groups_for_both_parts():
    # 96 tokens x G = 4 -> 3 Q blocks: one group of 3 with one part; with two, groups of 1
    # (two per part at least)
    s1, _ = schedule([96], [500], H=4, Hkv=1, d=32, B=16, LT=512)
    s2, kw = schedule([96], [500], H=4, Hkv=1, d=32, B=16, LT=512, parts=2)
    assert (s1.classes[0].blocks, s2.classes[0].blocks) == (3, 1)
    check_coverage(s2, **kw)
    assert all(len(set(r[r >= 0].tolist())) > 0 for r in _part_rows(s2.classes[0].partial))


LENS = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 1500)), min_size=1, max_size=6)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(lens=LENS, B=st.sampled_from([1, 4, 16, 32]), LT=st.sampled_from([512, 2048]),
       heads=st.sampled_from([(1, 1), (4, 1), (6, 3)]), window=st.sampled_from([None, 100]),
       ltp=st.sampled_from([None, "auto"]))
def test_two_parts_cover_every_visible_pair_exactly_once(lens, B, LT, heads, window, ltp):
    q, c = zip(*lens)
    s, kw = schedule(q, c, H=heads[0], Hkv=heads[1], d=16, B=B, LT=LT, window=window, LTp=ltp,
                     parts=2)
    check_coverage(s, **kw)


@pytest.mark.parametrize("bad", [0, 3, True, "2", 2.0])
def test_item_parts_is_validated(bad):
    with pytest.raises(ValueError, match=r"item_parts must be 1 \.\. 2 \(the physical cores"):
        schedule([1], [10], H=2, Hkv=1, d=8, B=16, LT=512, parts=bad)


def test_the_part_check_catches_a_group_in_two_parts():
    import dataclasses

    s, _ = schedule([1] * 5, [300, 2000, 90, 700, 5000], H=4, Hkv=1, d=16, B=16, LT=512,
                    parts=2)
    cls = s.classes[0]
    _check_parts(cls)
    rows = _part_rows(cls.partial).copy()
    rows[1, 0] = rows[0, 0]             # part 1's first item now of a group of part 0
    bad = dataclasses.replace(cls, partial=dataclasses.replace(
        cls.partial, item_block=rows.reshape(-1)))
    with pytest.raises(AssertionError, match="a group in both parts"):
        _check_parts(bad)

