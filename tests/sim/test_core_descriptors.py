"""Descriptor rule vs an independent per-element count, over random strided / indexed accesses."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import nki_sim

from test_core_helpers import nl, run


def _naive_descriptors(offsets: np.ndarray, valid: np.ndarray, itemsize: int) -> list:
    """One descriptor per (partition, maximal run of consecutive valid offsets), in order."""
    out = []
    for p in range(offsets.shape[0]):
        o = offsets[p].reshape(-1)
        v = valid[p].reshape(-1)
        run_len, prev = 0, None
        for off, ok in zip(o.tolist(), v.tolist()):
            if ok and run_len and off == prev + 1:
                run_len += 1
            else:
                if run_len:
                    out.append(run_len * itemsize)
                run_len = 1 if ok else 0
            prev = off if ok else None
        if run_len:
            out.append(run_len * itemsize)
    return out


def _load_view(x, *, r0, r1, rs, c0, c1, cs):
    t = nl.load(x[r0:r1:rs, c0:c1:cs])
    out = nl.ndarray(t.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 12), cols=st.integers(1, 40), data=st.data())
def test_basic_view_descriptors_match_naive_count(rows, cols, data):
    r0 = data.draw(st.integers(0, rows - 1))
    r1 = data.draw(st.integers(r0 + 1, rows))
    rs = data.draw(st.integers(1, 3))
    c0 = data.draw(st.integers(0, cols - 1))
    c1 = data.draw(st.integers(c0 + 1, cols))
    cs = data.draw(st.integers(1, 3))
    x = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    with nki_sim.tracing() as tr:
        out = run(_load_view, x, r0=r0, r1=r1, rs=rs, c0=c0, c1=c1, cs=cs)
    view = x[r0:r1:rs, c0:c1:cs]
    assert np.array_equal(out, view)
    offs = view.astype(np.int64)             # x holds its own flat offsets
    expect = _naive_descriptors(offs, np.ones(offs.shape, bool), 4)
    load = [e for e in tr.events if e.op == "load"][0]
    assert list(load.descriptor_bytes) == expect
    assert load.bytes == view.size * 4
    assert load.attr("hbm_contiguous") == (len(expect) == 1 or bool(np.all(np.diff(offs.reshape(-1)) == 1)))


def _masked_gather(x, idx, *, n):
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    it = nl.load(idx)
    t = nl.zeros((idx.shape[0], x.shape[1]), x.dtype)
    t[i_p, i_f] = nl.load(x[it[i_p, 0], i_f], mask=(i_f < n))
    out = nl.ndarray(t.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


@settings(max_examples=30, deadline=None)
@given(P=st.integers(1, 16), F=st.integers(1, 24), seed=st.integers(0, 2**16), data=st.data())
def test_indirect_masked_descriptors_match_naive_count(P, F, seed, data):
    n = data.draw(st.integers(0, F))
    rng = np.random.default_rng(seed)
    x = np.arange(20 * F, dtype=np.float32).reshape(20, F)
    idx = rng.integers(0, 20, (P, 1)).astype(np.int32)
    with nki_sim.tracing() as tr:
        out = run(_masked_gather, x, idx, n=n)
    ref = np.zeros((P, F), np.float32)
    ref[:, :n] = x[idx[:, 0], :n]
    assert np.array_equal(out, ref)
    offs = x[idx[:, 0]].astype(np.int64)
    valid = np.broadcast_to(np.arange(F)[None, :] < n, (P, F))
    ev = [e for e in tr.events if e.op == "load" and e.dma_kind == "indirect"][0]
    assert list(ev.descriptor_bytes) == _naive_descriptors(offs, valid, 4)
    assert ev.bytes == int(valid.sum()) * 4
