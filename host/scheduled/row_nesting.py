"""Nested KV rows of a partial phase: the order that lets the kernel zero its KV tiles once.

A partial (masked) item's gathers write some rows of the phase's K / V tiles (cache rows and
overlay rows; the rest are skipped, out-of-bounds ids) and the kernel needs every row they do not
write to hold zeros (``nki_kernels.scheduled.sched_tile.gather_kv``): a stale row from another
sequence could hold NaN, and ``P = 0`` times NaN is not 0 in the PV matmul. Zeroing the tiles
before each item costs a fill per item. If instead, within each KV head and item part, every
real item writes every row that the items before it wrote (the written row sets are *nested*),
then a row an item does not write was never written since the phase's tiles were zeroed: one
fill per head and part is enough (``SchedOptions.nested_rows``).

For a decode class each group (one sequence) has one partial item, its last tile, whose written
rows are a prefix (the cached rows, then the overlay rows); sorting the items by their written
row count makes the sets nested. :func:`nested_order` does that (groups stay contiguous: a
group's state is carried from one of its items to the next), :func:`rows_nested` checks the
result on the metadata the kernel reads, so the promise never rests on the sort's assumptions.
"""

from __future__ import annotations

import numpy as np

__all__ = ["nested_order", "nests", "rows_nested", "tile_rows_written"]


def nested_order(items: list, written) -> list:
    """``items`` ((group, tile) pairs of one part of a partial phase, ordered by group, then
    tile) as they are if the rows they write already nest, or else reordered so that they do if
    a sort can: each group's items by the number of rows they write, ascending, and the groups
    by their largest count, ascending (both sorts stable; a group's items stay contiguous).
    When neither order nests the items stay as they are. ``written(item)``: (128 * loads,) bool,
    the tile rows the item's gathers write."""
    sets = {it: np.asarray(written(it), bool) for it in items}
    if nests([sets[it] for it in items]):
        return list(items)
    groups: dict = {}
    for it in items:
        groups.setdefault(it[0], []).append(it)
    counts = {it: int(sets[it].sum()) for it in items}
    ordered = [sorted(lst, key=lambda it: counts[it]) for lst in groups.values()]
    ordered.sort(key=lambda lst: counts[lst[-1]])
    out = [it for lst in ordered for it in lst]
    return out if nests([sets[it] for it in out]) else list(items)


def nests(sets: list) -> bool:
    """Whether each row set contains the one before it."""
    return all(not (a & ~b).any() for a, b in zip(sets, sets[1:]))


def tile_rows_written(geo, keys, group_seq, group_lo):
    """``written(item)`` for :func:`nested_order`: the rows of partial item ``(g, k)``'s tile
    (geometry ``geo``, ``contract.TileGeometry``: L rows of b' tokens) that its gathers write --
    rows holding a key of group g's sequence (``group_seq[g]``; ``keys`` (S,) keys per
    sequence) that some row of the group may see (not wholly before ``group_lo[g]``, its first
    visible key; ``schedule_items.schedule_items``)."""
    n_rows = -(-np.asarray(keys, np.int64) // geo.bp)

    def written(item):
        g, k = item
        j = k * geo.L + np.arange(geo.L)
        return (j < n_rows[group_seq[g]]) & ((j + 1) * geo.bp > group_lo[g])
    return written


def rows_nested(meta_i: np.ndarray, *, kv_col: int, ov_col: int, loads: int, part_items,
                per_part: int, main_sentinel: int, ov_sentinel: int) -> bool:
    """Whether, in every KV head and item part, each real item's written rows contain the
    previous real item's (hence every earlier one's).

    Args:
        meta_i: (Hkv, 128, items, ki) int32, the partial phase's metadata
            (``schedule.PhaseArrays``): columns ``kv_col + l`` (cache row ids) and ``ov_col + l``
            (overlay row ids), l < ``loads``; an id at or past its sentinel is skipped.
        part_items: real items per part; part p's are items ``[p * per_part, p * per_part +
            part_items[p])`` (its padding items after them write nothing).
    """
    writes = ((meta_i[..., kv_col:kv_col + loads] < main_sentinel)
              | (meta_i[..., ov_col:ov_col + loads] < ov_sentinel))      # (Hkv, 128, items, nL)
    for p, n in enumerate(part_items):
        a = p * per_part
        prev, cur = writes[:, :, a:a + n - 1], writes[:, :, a + 1:a + n]
        if (prev & ~cur).any():
            return False
    return True
