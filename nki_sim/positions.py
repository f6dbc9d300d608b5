"""Resolved element positions of one access of a tensor view (:class:`Access`).

A basic view is accessed through its NumPy view (``adv`` False).  An indexed view (``nl.arange``
expressions, index tiles) resolves to flat element offsets into the allocation, checked against
the bounds (``mask=`` / ``oob_mode`` aware); the offsets are built only when needed, and
accesses whose last axis is a run of consecutive elements (row gathers and scatters, the
common indirect-DMA form) copy whole runs instead of single elements.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import errors as E


class Access:
    """Resolved element positions of one access of view ``t`` (with mask / oob handling)."""

    __slots__ = ("t", "valid", "adv", "skipped", "rows", "_terms", "_offs")

    def __init__(self, t: Tensor, mask=None, oob: str = "error"):
        self.t = t
        self.valid = mask
        self.adv = t.idx is not None   # element offsets (``offs``) instead of a basic view
        self.skipped = 0
        self.rows = None          # (first offset of each row, run length): see _row_runs
        self._offs = None
        if self.adv:
            self._resolve(oob)

    @property
    def offs(self):
        """Flat element offsets of an indexed access (int64, shape ``t.shape``), built on first
        use; None for a basic view."""
        if not self.adv:
            return None
        offs = self._offs
        if offs is None:
            terms = self._terms
            for term in terms:
                offs = term if offs is None else offs + term
            if offs is terms[0] or offs.shape != self.t.shape:
                offs = np.array(np.broadcast_to(offs, self.t.shape), dtype=np.int64)
            self._offs = offs
            self._terms = None
        return offs

    def _resolve(self, oob):
        t = self.t
        dims = t.arr.shape
        off, es = t.elem_layout()
        valid = self.valid
        terms = []                    # broadcastable per-axis offset arrays
        bad_any = None
        for ax, c in enumerate(t.idx):
            if not isinstance(c, np.ndarray):
                off += c * es[ax]
                continue
            n = dims[ax]
            if c.size and (c.min() < 0 or c.max() >= n):
                bad = (c < 0) | (c >= n)
                badb = np.broadcast_to(bad, t.shape)
                if valid is not None:
                    badb = badb & valid
                if badb.any():
                    if ax == t.indirect:
                        if oob == "skip":
                            bad_any = badb if bad_any is None else (bad_any | badb)
                        else:
                            self._indirect_error(badb, dims)
                    else:
                        cv = np.broadcast_to(c, t.shape)
                        sel = cv if valid is None else cv[valid]
                        raise E.AccessOutOfBoundError(
                            f"Out-of-bound access for tensor `{t.name}` on dimension {ax}: index range "
                            f"[{int(sel.min())}, {int(sel.max())}] exceed dimension size of {n}")
                c = np.clip(c, 0, n - 1)
            terms.append(c * es[ax] if es[ax] != 1 else c)
        if not terms:
            terms.append(np.full(t.shape, off, dtype=np.int64))
        elif off:                     # fold the constant part into the smallest term
            k = min(range(len(terms)), key=lambda i: terms[i].size)
            terms[k] = terms[k] + off
        self.rows = _row_runs(terms, t.shape)
        self._terms = terms           # offs: their broadcast sum, built when first needed
        if bad_any is not None:
            rows = bad_any.reshape(bad_any.shape[0], -1).any(axis=1) if bad_any.ndim else bad_any
            self.skipped = int(np.count_nonzero(rows))
            keep = ~bad_any
            valid = keep if valid is None else (valid & keep)
        self.valid = valid

    def _indirect_error(self, badb, dims):
        t = self.t
        first = np.unravel_index(int(np.argmax(badb.reshape(-1))), t.shape)
        cstrides = np.cumprod((1,) + tuple(dims[::-1]))[:-1][::-1]
        flat = 0
        for ax, c in enumerate(t.idx):
            v = c if not isinstance(c, np.ndarray) else int(np.broadcast_to(c, t.shape)[first])
            flat += int(v) * int(cstrides[ax])
        size = int(np.prod(dims, dtype=np.int64))
        if flat >= size or flat < 0:     # NumPy's message for the flattened tensor (API notes §3.5)
            raise E.IndirectIndexError(f"index {flat} is out of bounds for axis 0 with size {size}")
        ax = t.indirect                  # in bounds once flattened: name the indexed axis instead
        v = int(np.broadcast_to(t.idx[ax], t.shape)[first])
        raise E.IndirectIndexError(f"index {v} is out of bounds for axis {ax} with size {dims[ax]}")

    def gather(self, base: np.ndarray) -> np.ndarray:
        """Values of ``base`` (same shape as ``alloc.data``) at this access (shape ``t.shape``)."""
        if not self.adv:
            t = self.t
            return t.arr if base is t.alloc.data else t.aux_view(base)
        flat = base.reshape(-1)
        if self.rows is not None:     # runs of consecutive elements: copy them row by row
            starts, run = self.rows
            return _runs(flat, run)[starts].view(flat.dtype).reshape(self.t.shape)
        return flat[self.offs]

    def scatter(self, base: np.ndarray, values) -> None:
        valid = self.valid
        if not self.adv:
            t = self.t
            view = t.arr if base is t.alloc.data else t.aux_view(base)
            if valid is None:
                np.copyto(view, values, casting="unsafe")
            else:
                np.copyto(view, values, casting="unsafe", where=valid)
            return
        flat = base.reshape(-1)
        rows = self.rows
        keep = None
        if rows is not None and valid is not None:
            keep = _row_mask(valid, rows[1]) if valid.shape == self.t.shape else None
            if keep is None:
                rows = None
        if rows is not None:
            starts, run = rows
            v = np.asarray(np.broadcast_to(values, self.t.shape), dtype=flat.dtype).reshape(-1, run)
            if keep is not None:
                starts, v = starts[keep], v[keep]
            # rows in order (later rows win, as with flat[offs]); the cast to the storage dtype is
            # the one assignment does (float -> float: RNE)
            _runs(flat, run)[starts] = v.view(_UINT[flat.itemsize])
            return
        if valid is None:
            flat[self.offs] = values
        else:
            v = np.broadcast_to(values, self.t.shape)
            flat[self.offs[valid]] = v[valid]

    def count(self) -> int:
        return self.t.size if self.valid is None else int(np.count_nonzero(self.valid))


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _runs(flat: np.ndarray, run: int) -> np.ndarray:
    """View of 1-D ``flat`` whose row i is ``flat[i:i + run]`` (overlapping rows, no copy), as
    unsigned integers of the same size (``as_strided`` cannot build ml_dtypes views)."""
    u = flat.view(_UINT[flat.itemsize])
    return as_strided(u, shape=(u.size - run + 1, run), strides=(u.itemsize, u.itemsize))


def _row_mask(valid: np.ndarray, run: int):
    """Per-row flags (C order) when ``valid`` is constant along its last axis (rows wholly in or
    out), else None."""
    v = valid.reshape(-1, run)
    first = v[:, 0]
    if (v == first[:, None]).all():
        return first
    return None


def _row_runs(terms, shape):
    """``(starts, run)`` when the element offsets ``sum(terms)`` (broadcast to ``shape``) are,
    along the last axis, runs of ``run`` consecutive elements -- one term ``c0 + arange(run)``
    on the last axis, the other terms constant along it -- with ``starts`` the flat first
    offset of each run (int64, C order); else None."""
    if len(shape) < 2 or not terms or shape[-1] < 2:
        return None
    run = shape[-1]
    last = [t for t in terms if t.ndim == len(shape) and t.shape[-1] == run]
    if len(last) != 1 or last[0].size != run:
        return None
    col = last[0].reshape(-1)
    if col.dtype.kind not in "iu" or not (col[1:] - col[:-1] == 1).all():
        return None
    head = int(col[0])
    rest = [t for t in terms if t is not last[0]]
    if any(t.ndim and t.shape[-1] != 1 for t in rest):      # constant along the last axis
        return None
    starts = np.full(shape[:-1] + (1,), head, dtype=np.int64)
    for t in rest:
        starts = starts + t
    return np.ascontiguousarray(np.broadcast_to(starts, shape[:-1] + (1,))).reshape(-1), run
