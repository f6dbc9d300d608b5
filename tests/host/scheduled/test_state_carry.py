"""host/scheduled/state_carry.py: the group whose state stays in SBUF from the full phase to the
partial phase (``carry_order``), its metadata (no store, no load, a continuation flag, the full
phase's padding first), read back by the symbolic launch -- and a must-fail: the same schedule
with the full phase's padding moved after the carried group is caught there."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from host.scheduled.state_carry import carry_order
from symbolic_schedule import check_coverage, schedule


def _prefix(n, size=8):
    return np.arange(size) < n


def test_the_first_partial_group_with_full_items_is_carried():
    full = [(0, 0), (0, 1), (1, 0)]
    part = [(1, 1), (2, 0), (0, 2)]
    rows = {(1, 1): 3, (2, 0): 5, (0, 2): 8}
    f, p, g = carry_order(full, part, lambda it: _prefix(rows[it]), decode=False)
    assert g == 1 and f == [(0, 0), (0, 1), (1, 0)] and p == part       # already in place
    part = [(2, 0), (0, 2), (1, 1)]
    rows = {(2, 0): 8, (0, 2): 8, (1, 1): 8}
    f, p, g = carry_order(full, part, lambda it: _prefix(rows[it]), decode=False)
    assert g == 0 and f == [(1, 0), (0, 0), (0, 1)] and p == [(0, 2), (2, 0), (1, 1)]


def test_no_carry_for_decode_classes_disjoint_phases_or_a_broken_nesting():
    full, part = [(0, 0)], [(1, 0), (0, 1)]
    written = {(1, 0): _prefix(3), (0, 1): _prefix(6)}.get
    assert carry_order(full, part, written, decode=True) == (full, part, None)
    assert carry_order([(2, 0)], part, written, decode=False) == ([(2, 0)], part, None)
    # group 0 first would put 6 written rows before 3: the nesting the order had is kept
    assert carry_order(full, part, written, decode=False) == (full, part, None)
    # without nesting to keep, group 0 moves first
    written = {(1, 0): ~_prefix(6), (0, 1): _prefix(6)}.get
    assert carry_order(full, part, written, decode=False)[2] == 0


@pytest.mark.parametrize("parts", [1, 2])
def test_carried_group_metadata_and_symbolic_launch(parts):
    # seq0: 9 full tiles (bucket 10: one padding item, placed first) and partial items; seq1
    # partial only. seq0's group ends the full phase and starts the partial phase.
    s, kw = schedule([300, 200], [4700, 500], H=8, Hkv=2, d=8, B=16, LT=512, parts=parts)
    (cls,) = s.classes
    items = check_coverage(s, **kw)[0]
    full = [it for it in items if it.phase == "full" and it.real]
    part = [it for it in items if it.phase == "partial" and it.real]
    assert full[-1].seq == 0 and not full[-1].st                     # no state store
    assert part[0].seq == 0 and not part[0].reset and not part[0].st  # no reset, no load
    if parts == 1:
        assert cls.full.item_block.tolist()[0] == -1                 # padding first
        assert not any(it.st for it in items)                        # no round trip at all


def test_padding_after_a_carried_group_is_caught():
    # must-fail: the full phase's padding item moved behind the carried group's last full
    # item would fold the stale tiles into the state the partial phase continues
    s, kw = schedule([300, 200], [4700, 500], H=8, Hkv=2, d=8, B=16, LT=512)
    (cls,) = s.classes
    arr = cls.full
    n, ki = arr.items, arr.meta_i.shape[2] // arr.items
    kf = arr.meta_f.shape[1] // arr.items
    order = list(range(1, n)) + [0]
    mi = arr.meta_i.reshape(arr.meta_i.shape[0], 128, n, ki)[:, :, order].reshape(arr.meta_i.shape)
    mf = arr.meta_f.reshape(128, n, kf)[:, order].reshape(arr.meta_f.shape)
    moved = dataclasses.replace(arr, meta_i=mi, meta_f=mf, item_block=arr.item_block[order])
    bad = dataclasses.replace(s, classes=(dataclasses.replace(cls, full=moved),))
    with pytest.raises(AssertionError):
        check_coverage(bad, **kw)
