"""The affine_range dependency checker (nki_sim/deps.py, symbolic access log replayed on overlap)
against an eager per-element model written here from the rule:

    every access inside an affine iteration stamps its elements with the current epoch (epochs
    advance at each loop start, each affine iteration start and each loop end); an element
    conflicts when its latest write stamp (for a read), or its latest write or read stamp (for
    a write), lies in [loop start, iteration start) of an enclosing affine loop.

Random programs of reads and writes (box slices, strided slices, nl.arange accesses, masked
accesses) in nested loops must raise exactly where the model finds the first conflict, naming
the same element, iteration and earlier iteration -- or pass when the model finds none.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nki_sim import deps
from nki_sim import errors as E

from test_core_helpers import nl, run

P, F = 4, 8                                       # the checked tile (SBUF, float32)
pytestmark = pytest.mark.simulation


# --------------------------------------------------------------------------- programs
access = st.tuples(
    st.sampled_from(["read", "write"]),
    st.sampled_from(["box", "strided", "arange", "masked"]),
    st.integers(0, P - 1), st.integers(1, P),     # row start, rows
    st.integers(0, F - 1), st.integers(1, F),     # column start, columns
    st.integers(-1, 2), st.integers(-1, 2),       # column shift per outer / inner iteration
    st.integers(1, F),                            # mask: keep columns < this
)
program = st.tuples(
    st.sampled_from(["affine", "sequential"]), st.integers(1, 3),     # outer loop
    st.sampled_from(["affine", "sequential", None]), st.integers(1, 3),   # inner loop
    st.lists(access, min_size=1, max_size=4),
    st.lists(st.booleans(), min_size=4, max_size=4),    # access j sits in the inner loop
)


def _geometry(acc, i, j):
    """(rows, column start, columns, step, masked cols) of an access in iterations (i, j)."""
    _, form, r0, nr, c0, nc, di, dj, keep = acc
    nr = min(nr, P - r0)
    c0 = (c0 + di * i + dj * j) % F
    step = 2 if form == "strided" else 1
    nc = max(1, min(nc, (F - c0 + step - 1) // step))
    return r0, nr, c0, nc, step, (keep if form == "masked" else None)


def _kernel(x, *, prog):
    outer_kind, n_outer, inner_kind, n_inner, accesses, inner_flags = prog
    out = nl.ndarray((P, F), nl.float32, buffer=nl.shared_hbm)
    buf = nl.ndarray((P, F), nl.float32)
    buf[...] = 0.0
    src = nl.load(x)
    loop = {"affine": nl.affine_range, "sequential": nl.sequential_range}

    def body(i, j, inner):
        for a, acc in enumerate(accesses):
            if bool(inner_flags[a]) != inner:
                continue
            kind, form = acc[0], acc[1]
            r0, nr, c0, nc, step, keep = _geometry(acc, i, j)
            if form in ("box", "strided"):
                view = buf[r0:r0 + nr, c0:c0 + step * (nc - 1) + 1:step]
                mask = None
            else:
                i_p, i_f = nl.arange(nr)[:, None], nl.arange(nc)[None, :]
                view = buf[r0 + i_p, c0 + i_f]
                mask = (i_f < keep) if keep is not None else None
            if kind == "read":
                nl.copy(view, mask=mask)
            elif form in ("box", "strided"):
                view[...] = nl.copy(src[0:nr, 0:nc])
            else:
                buf[r0 + i_p, c0 + i_f] = nl.copy(src[0:nr, 0:nc], mask=mask)

    for i in loop[outer_kind](n_outer):
        body(i, 0, False)
        if inner_kind is not None:
            for j in loop[inner_kind](n_inner):
                body(i, j, True)
    nl.store(out, buf)
    return out


# --------------------------------------------------------------------------- the model
def _model(prog):
    """The first conflict as (kind, access index, iteration, earlier iteration, earlier kind),
    or None, by eager per-element epochs."""
    outer_kind, n_outer, inner_kind, n_inner, accesses, inner_flags = prog
    ids = np.arange(P * F).reshape(P, F)
    wst = np.full(P * F, -1)
    rst = np.full(P * F, -1)
    epoch = 0
    frames = []        # [kind, loop_start, iter_start, value, starts, values]

    def elements(acc, i, j):
        r0, nr, c0, nc, step, keep = _geometry(acc, i, j)
        e = ids[r0:r0 + nr, c0:c0 + step * (nc - 1) + 1:step]
        valid = None if keep is None else np.broadcast_to(np.arange(nc)[None, :] < keep, e.shape)
        return e, valid

    def conflict(stamps, e, valid, kind, prev_kind):
        s = stamps[e]
        for f in frames:
            if f[0] != "affine":
                continue
            bad = (s >= f[1]) & (s < f[2])
            if valid is not None:
                bad &= valid
            if bad.any():
                first = np.unravel_index(int(np.argmax(bad.reshape(-1))), bad.shape)
                k = np.searchsorted(f[4], int(s[first]), side="right") - 1
                return (kind, [int(v) for v in first], f[3], f[5][k], prev_kind)
        return None

    def body(i, j, inner):
        for a, acc in enumerate(accesses):
            if bool(inner_flags[a]) != inner:
                continue
            e, valid = elements(acc, i, j)
            sel = e if valid is None else e[valid]
            if acc[0] == "read":
                c = conflict(wst, e, valid, "reads", "wrote")
                if c:
                    return c
                if any(f[0] == "affine" for f in frames):
                    rst[sel] = epoch
            else:
                c = conflict(wst, e, valid, "writes", "wrote") or conflict(rst, e, valid, "writes", "read")
                if c:
                    return c
                if any(f[0] == "affine" for f in frames):
                    wst[sel] = epoch
        return None

    def run_loop(kind, n, inner_fn):
        nonlocal epoch
        epoch += 1
        f = [kind, epoch, epoch, 0, [], []]
        frames.append(f)
        try:
            for v in range(n):
                f[3] = v
                if kind == "affine":
                    epoch += 1
                    f[2] = epoch
                    f[4].append(epoch)
                    f[5].append(v)
                c = inner_fn(v)
                if c:
                    return c
        finally:
            frames.pop()
            epoch += 1
        return None

    def outer_body(i):
        c = body(i, 0, False)
        if c or inner_kind is None:
            return c
        return run_loop(inner_kind, n_inner, lambda j: body(i, j, True))

    return run_loop(outer_kind, n_outer, outer_body)


_MSG = re.compile(r"'copy' (reads|writes) tensor \S+ \[[^\]]*\] at access index \[([^\]]*)\] in "
                  r"iteration (\d+) of nl.affine_range at \S+, but iteration (\d+) (wrote|read) it")
_MSG_ASSIGN = re.compile(r"'assign' (reads|writes) tensor \S+ \[[^\]]*\] at access index \[([^\]]*)\] "
                         r"in iteration (\d+) of nl.affine_range at \S+, but iteration (\d+) (wrote|read) it")


# replay order: a box read again moves after the reads logged since (its epoch is the newest)
_REREAD = ("affine", 2, None, 1, [("read", "box", 0, 4, 4, 4, 0, 0, 8), ("read", "box", 0, 4, 2, 4, 2, 0, 8),
                                  ("write", "box", 0, 4, 2, 2, 2, 0, 8)], [False] * 4)
# a replayed conflict under a pending access of the current iteration (max_pending=1)
_UNDER = ("affine", 2, None, 1, [("write", "box", 0, 4, 0, 2, 2, 0, 8), ("write", "box", 0, 4, 7, 4, 1, 0, 8)],
          [False] * 4)


@pytest.mark.parametrize("max_pending", [1, 2, deps._MAX_PENDING])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(prog=_REREAD)
@example(prog=_UNDER)
@given(prog=program)
def test_checker_matches_the_per_element_model(max_pending, prog):
    """``max_pending``: how many symbolic entries a log keeps before replaying them (small values
    exercise the replayed per-element path, the default the symbolic one)."""
    x = np.arange(P * F, dtype=np.float32).reshape(P, F)
    want = _model(prog)
    saved, deps._MAX_PENDING = deps._MAX_PENDING, max_pending
    try:
        if want is None:
            run(_kernel, x, prog=prog)
            return
        with pytest.raises(E.OutputDependencyError) as ei:
            run(_kernel, x, prog=prog)
    finally:
        deps._MAX_PENDING = saved
    m = _MSG.search(str(ei.value)) or _MSG_ASSIGN.search(str(ei.value))
    assert m, str(ei.value)
    got = (m.group(1), [int(v) for v in m.group(2).split(",")], int(m.group(3)), int(m.group(4)),
           m.group(5))
    assert got == want, str(ei.value)


def test_model_finds_a_known_conflict_and_a_known_pass():
    """The model itself: a write of the same box in two affine iterations conflicts; writes of
    disjoint boxes do not."""
    same = ("affine", 2, None, 1, [("write", "box", 0, 2, 0, 4, 0, 0, 8)], [False] * 4)
    disjoint = ("affine", 2, None, 1, [("write", "box", 0, 2, 0, 4, 4, 0, 8)], [False] * 4)
    assert _model(same) == ("writes", [0, 0], 1, 0, "wrote")
    assert _model(disjoint) is None
    assert _model(_REREAD) is None
    assert _model(_UNDER) == ("writes", [0, 0], 1, 0, "wrote")
