"""A group's state carried in SBUF from the full phase to the partial phase, with no round trip.

A query-rows group whose context needs full tiles folds them in the full phase, stores its fp32
state (o, -m, l of every row) to an HBM scratch after its last full item, and loads it back at
its first partial item (``nki_kernels.scheduled.sched_item.load_state``). The kernel keeps one
state tile per class and KV head, shared by both phases, and nothing touches it between the
phases' items. So if, in a part, the full phase's LAST item and the partial phase's FIRST item
belong to the same group, that group's state is already in the tile when its partial items
start: the host skips its store and its load, and marks its first partial item as a
continuation (reset flag 0: no select of the initial values, no Q^T or row-init reload).

:func:`carry_order` orders one part's items so: the carried group's full items last, its
partial items first (keeping the partial order's nesting, ``host.scheduled.row_nesting``, if it
had it). The full phase then puts its padding items BEFORE its real items (a padding item folds
whatever its skipped DMAs left in the tiles into the state: the next real item starts a group
and resets it), so nothing runs between the carried group's last full item and its first
partial one. Decode-layout classes keep the round trip: their partial order is sorted for
nested rows, and their phases are mostly fresh instead (``host.scheduled.fresh_items``), which
a carried group would rule out.
"""

from __future__ import annotations

import numpy as np

from host.scheduled.row_nesting import nests

__all__ = ["carry_order"]


def carry_order(full: list, part: list, written, *, decode: bool):
    """``(full, part, carried)`` for one part of a class: ``full`` / ``part`` its full and
    partial items, ((group, tile) pairs, each group's items contiguous), reordered so that the
    group ``carried`` ends the full phase and starts the partial phase, or unchanged with
    ``carried`` None (a decode class; no group with items in both phases; or every such group,
    moved first, would break the partial items' nesting). ``written(item)``: the partial
    item's written tile rows (``row_nesting.tile_rows_written``)."""
    if decode or not full or not part:
        return full, part, None
    in_full = {g for g, _ in full}
    was_nested = nests([np.asarray(written(it), bool) for it in part])
    for g in dict.fromkeys(gg for gg, _ in part):            # partial order, first seen
        if g not in in_full:
            continue
        new_part = [it for it in part if it[0] == g] + [it for it in part if it[0] != g]
        if was_nested and not nests([np.asarray(written(it), bool) for it in new_part]):
            continue
        new_full = [it for it in full if it[0] != g] + [it for it in full if it[0] == g]
        return new_full, new_part, g
    return full, part, None
