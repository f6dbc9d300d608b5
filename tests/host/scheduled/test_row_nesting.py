"""host/scheduled/row_nesting.py: the partial items' order whose written KV rows nest, the check
behind ``SchedOptions.nested_rows``, and the symbolic launch's independent reading of that
promise (symbolic_schedule.run_symbolically tracks what each key slot of the once-zeroed tiles
holds)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from host.scheduled.row_nesting import nested_order, rows_nested
from symbolic_schedule import check_coverage, schedule


def _prefix(n, size=8):
    return np.arange(size) < n


# ------------------------------------------------------------------------- nested_order
def test_an_order_that_nests_is_kept():
    items = [(0, 1), (1, 0), (2, 0)]
    rows = {(0, 1): _prefix(2), (1, 0): _prefix(2), (2, 0): _prefix(8)}
    assert nested_order(items, rows.get) == items


def test_prefix_rows_are_sorted_fewest_first_groups_contiguous():
    # group 0: tiles 0 (8 rows) and 1 (3 rows); group 1: 5 rows; group 2: 1 row
    items = [(0, 0), (0, 1), (1, 0), (2, 0)]
    rows = {(0, 0): _prefix(8), (0, 1): _prefix(3), (1, 0): _prefix(5), (2, 0): _prefix(1)}
    out = nested_order(items, rows.get)
    assert sorted(out) == sorted(items)
    # group 1 (largest 5) cannot follow group 0's 8 rows: group 0 (largest 8) goes last, its
    # own items fewest first -- but then 5 -> 3 does not nest, so the order stays as it was
    assert out == items
    rows[(0, 1)] = _prefix(6)
    assert nested_order(items, rows.get) == [(2, 0), (1, 0), (0, 1), (0, 0)]


def test_sets_that_no_order_nests_keep_the_order():
    items = [(0, 0), (1, 0)]
    a, b = np.zeros(8, bool), np.zeros(8, bool)
    a[:2], b[4:6] = True, True                      # disjoint: neither contains the other
    assert nested_order(items, {(0, 0): a, (1, 0): b}.get) == items


# ------------------------------------------------------------------------- rows_nested
def _meta(written, *, loads=1, sentinel=100):
    """(1, 128, items, 2 * loads) metadata: cache ids in columns [0, loads), overlay ids in
    [loads, 2 * loads); ``written[t]`` (128 * loads,) bool: rows item t writes (by the cache
    table for even rows, the overlay table for odd ones)."""
    items = len(written)
    mi = np.full((1, 128, items, 2 * loads), sentinel, np.int32)
    for t, w in enumerate(written):
        w = np.asarray(w, bool).reshape(loads, 128).T                # (128, loads)
        even = (np.arange(128) % 2 == 0)[:, None]
        mi[0, :, t, :loads] = np.where(w & even, 1, sentinel)
        mi[0, :, t, loads:] = np.where(w & ~even, 2, sentinel)
    return mi


def _check(mi, part_items, per_part, loads=1):
    return rows_nested(mi, kv_col=0, ov_col=loads, loads=loads, part_items=part_items,
                       per_part=per_part, main_sentinel=100, ov_sentinel=100)


def test_rows_nested_holds_for_growing_sets_and_fails_for_a_shrinking_one():
    grow = [np.arange(128) < n for n in (3, 3, 40, 128)]
    assert _check(_meta(grow), [4], 4)
    shrink = [np.arange(128) < n for n in (3, 40, 39)]
    assert not _check(_meta(shrink), [3], 3)


def test_rows_nested_counts_both_tables_and_every_load():
    # item 1 writes row 1 by the overlay table where item 0 wrote it: nested; item 2 drops
    # load 1's rows
    w0 = np.zeros(256, bool)
    w0[[0, 1, 130]] = True
    w1 = w0.copy()
    w1[[2, 131]] = True
    w2 = w1.copy()
    w2[130:] = False
    assert _check(_meta([w0, w1], loads=2), [2], 2, loads=2)
    assert not _check(_meta([w0, w1, w2], loads=2), [3], 3, loads=2)


def test_padding_items_and_part_starts_are_not_compared():
    # part 0: items 0, 1 real (3 then 5 rows), item 2 padding (writes nothing); part 1 starts
    # again with 1 row
    sets = [np.arange(128) < n for n in (3, 5, 0, 1, 2, 0)]
    assert _check(_meta(sets), [2, 2], 3)
    assert not _check(_meta(sets), [3, 2], 3)         # the padding item counted as real


# ------------------------------------------------------------------------- schedules
@settings(max_examples=30, deadline=None, derandomize=True)
@given(ctx=st.lists(st.integers(0, 9000), min_size=1, max_size=12),
       B=st.sampled_from([8, 16, 32]), LT=st.sampled_from([512, 2048, 4096]),
       ltp=st.sampled_from([None, "auto"]), parts=st.sampled_from([1, 2]))
def test_decode_batches_without_a_window_nest(ctx, B, LT, ltp, parts):
    """One-token decodes (G = 4): every sequence's one partial item writes a prefix of its
    tile's rows, so the host's order nests -- unless full tiles moved into the partial phase's
    padding (``schedule_items.fill_partial_padding``: all 128 rows, in their sequence's group,
    which must stay contiguous); the symbolic launch, which tracks each key slot of the
    once-zeroed tiles, confirms that no item meets an earlier item's key."""
    s, kw = schedule([1] * len(ctx), ctx, H=8, Hkv=2, d=16, B=B, LT=LT, LTp=ltp, parts=parts)
    (cls,) = s.classes
    assert cls.kind == "decode"
    moved = cls.partial.real_items - len(ctx)
    assert moved >= 0 and (cls.partial.nested_rows or moved > 0)
    check_coverage(s, **kw)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(lens=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 3000)), min_size=1,
                     max_size=6),
       window=st.sampled_from([None, 100, 1000]), B=st.sampled_from([16, 32]))
def test_whatever_the_host_promises_the_symbolic_tiles_confirm(lens, window, B):
    q, c = zip(*lens)
    s, kw = schedule(list(q), list(c), H=4, Hkv=1, d=16, B=B, LT=2048, LTp="auto",
                     window=window)
    check_coverage(s, **kw)         # raises if a promised class meets a stale key


def test_the_symbolic_nesting_check_can_fail():
    # must-fail side: 500-token then 40-token context (31 then 3 rows at B = 16) in group order
    # with the promise forced on: the second item's tile still holds the first's rows
    s, kw = schedule([1, 1], [500, 40], H=4, Hkv=1, d=16, B=16, LT=512)
    (cls,) = s.classes
    assert cls.partial.nested_rows          # the host sorted the 3-row item first
    order = [int(g) for g in cls.partial.item_block[:cls.partial.real_items]]
    assert order == [1, 0]
    swapped = _swap_partial_items(cls)
    bad = dataclasses.replace(s, classes=(dataclasses.replace(cls, partial=swapped),))
    with pytest.raises(AssertionError, match="nested_rows"):
        check_coverage(bad, **kw)


def _swap_partial_items(cls):
    """The partial phase of a two-item class with its two items swapped (metadata columns,
    bounds and item blocks), still promising nested rows."""
    arr = cls.partial
    hkv, _, total = arr.meta_i.shape
    ki = total // arr.items
    mi = arr.meta_i.reshape(hkv, 128, arr.items, ki)[:, :, [1, 0] + list(range(2, arr.items))]
    kf = arr.meta_f.shape[1] // arr.items
    mf = arr.meta_f.reshape(128, arr.items, kf)[:, [1, 0] + list(range(2, arr.items))]
    nb = arr.bounds.reshape(arr.items, -1)[[1, 0] + list(range(2, arr.items))]
    blocks = arr.item_block[[1, 0] + list(range(2, arr.items))]
    return dataclasses.replace(arr, meta_i=mi.reshape(hkv, 128, total),
                               meta_f=mf.reshape(128, -1), bounds=nb.reshape(1, -1),
                               item_block=blocks, nested_rows=True)
