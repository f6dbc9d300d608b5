"""Phases whose items each start their group: the kernel's state select and load can go.

An item of the scheduled kernel begins by resetting its group's state when the group starts
there (a select of the initial values, keyed by the item's reset flag) and, in the partial
phase, by loading the state the full phase left (a gather, skipped for groups without full
items). When every item of a phase that stores anything starts its group and no item loads a
state, nothing carries from one item to the next: each item may read the group's initial
values straight from the init tile at its first step instead of selecting them into the state
(``SchedOptions.fresh_items``, decode-layout classes). Decode classes have one item per
sequence per phase, so their full phase is fresh unless a sequence has two full tiles, and their
partial phase is fresh when no sequence has a full tile.

:func:`phase_fresh` decides on the metadata the kernel reads (``meta_i`` / ``meta_f``,
docs/layouts.md §16.2), so the promise never rests on how the schedule was built.
"""

from __future__ import annotations

import numpy as np

__all__ = ["phase_fresh"]


def phase_fresh(mi: np.ndarray, mf: np.ndarray, *, masked: bool, reset_col: int, st_col: int,
                out_col: int | None, st_skip: int, out_skip: int) -> bool:
    """Whether every item of one phase that stores anything starts its group and no item
    loads a state.

    Args:
        mi: (Hkv, 128, items, ki) int32 item metadata (its ``st_col``: the full phase's state
            store rows / the partial phase's state load rows; ``out_col``: output rows).
        mf: (128, items, kf) float32 (its ``reset_col``: 1.0 where the item starts its group).
        masked: the partial phase (loads states, stores outputs) or the full one (stores states).
        st_skip, out_skip: the skipped-row ids of the state and output columns.
    """
    starts = mf[0, :, reset_col] == 1.0
    if masked:
        if (mi[:, :, :, st_col] != st_skip).any():            # a state load
            return False
        stores = (mi[:, :, :, out_col] != out_skip).any(axis=(0, 1))
    else:
        stores = (mi[:, :, :, st_col] != st_skip).any(axis=(0, 1))
    return bool(np.all(starts | ~stores))
