"""host/scheduled/fresh_items.py: the metadata check behind ``SchedOptions.fresh_items`` (a
phase's items each start their group and none loads a state), must-pass and must-fail cases on
hand-made metadata, and the flags ``make_schedule`` sets on decode and prefill classes."""

from __future__ import annotations

import numpy as np

from host.scheduled.fresh_items import phase_fresh
from symbolic_schedule import schedule

SKIP_ST, SKIP_OUT = 99, 77
RESET, ST, OUT = 0, 1, 2


def _meta(resets, st_rows, out_rows):
    """(mi, mf) of len(resets) items, 2 KV heads: mf[:, t, RESET] = resets[t]; item t's state
    column holds st_rows[t] (None: skipped) and its output column out_rows[t]."""
    n = len(resets)
    mi = np.zeros((2, 128, n, 3), np.int32)
    mf = np.zeros((128, n, 1), np.float32)
    for t in range(n):
        mf[:, t, RESET] = resets[t]
        mi[:, :, t, ST] = SKIP_ST if st_rows[t] is None else st_rows[t]
        mi[:, :, t, OUT] = SKIP_OUT if out_rows[t] is None else out_rows[t]
    return mi, mf


def _fresh(mi, mf, masked):
    return phase_fresh(mi, mf, masked=masked, reset_col=RESET, st_col=ST,
                       out_col=OUT if masked else None, st_skip=SKIP_ST, out_skip=SKIP_OUT)


def test_full_phase_items_that_all_start_their_groups_are_fresh():
    # two items storing states, both group starts, then a padding item (no reset, no store)
    mi, mf = _meta([1, 1, 0], [3, 4, None], [None] * 3)
    assert _fresh(mi, mf, masked=False)


def test_an_item_carrying_its_groups_state_is_not_fresh():
    # the second item continues the first one's group (reset 0) and stores the state
    mi, mf = _meta([1, 0], [None, 3], [None] * 2)
    assert not _fresh(mi, mf, masked=False)


def test_partial_phase_fresh_only_without_state_loads():
    mi, mf = _meta([1, 1, 0], [None, None, None], [5, 6, None])
    assert _fresh(mi, mf, masked=True)
    mi, mf = _meta([1, 1], [None, 2], [5, 6])            # the second item loads a state
    assert not _fresh(mi, mf, masked=True)
    mi[:, :, 1, ST] = SKIP_ST
    mi[1, 7, 1, ST] = 2                                  # one partition of one head is enough
    assert not _fresh(mi, mf, masked=True)


def test_make_schedule_flags_decode_phases():
    # B=16, LT=512: seq0 (c=1000) has a full tile, so the decode class's partial phase loads its
    # state; its full phase (one full item) is fresh. Alone, the short decodes are fresh in both.
    s, _ = schedule([1, 3, 1], [1000, 509, 40], H=4, Hkv=2, d=8, B=16, LT=512)
    (dec,) = s.classes
    assert dec.full.fresh_items and not dec.partial.fresh_items
    s, _ = schedule([1, 3], [300, 40], H=4, Hkv=2, d=8, B=16, LT=512)
    (dec,) = s.classes
    assert dec.full.fresh_items and dec.partial.fresh_items


def test_make_schedule_a_prefill_group_of_several_tiles_is_not_fresh():
    # seq0 (150 new tokens on 1400 cached) folds several tiles into one group: its second item
    # carries the state of its first
    s, _ = schedule([150], [1400], H=4, Hkv=2, d=8, B=16, LT=512)
    (pre,) = s.classes
    assert not pre.full.fresh_items
