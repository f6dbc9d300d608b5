"""Index forms: basic / advanced shapes, masks, indirect DMA (forms, OOB text, skip), illegal mixes."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from nki_sim import errors as E

from test_core_helpers import f32, nisa, nl, run


def _shapes(x):
    t = nl.load(x[0])                                  # HBM int index drops the axis
    assert t.shape == (4, 8)
    s = nl.zeros((128, 4), nl.float32)
    assert s[:, 0].shape == (128, 1)                   # an on-chip view stays >= 2-D
    assert nl.zeros((128, 4, 2), nl.float32)[:, 0].shape == (128, 2)   # int on a free axis drops it
    assert s[3, :].shape == (1, 4)                     # int on the partition axis keeps size 1
    assert s[nl.ds(8, 16), 1:3].shape == (16, 2)
    i_p, i_f = nl.mgrid[0:128, 0:2]
    assert s[i_p, i_f].shape == (128, 2)
    i = nl.arange(4)[None, :]
    assert s[nl.arange(128)[:, None], 2 * i // 2].shape == (128, 4)
    assert x[1, nl.arange(4)[:, None], nl.arange(8)[None, :]].shape == (4, 8)
    out = nl.ndarray((4, 8), x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def test_view_shapes(rng):
    x = f32(rng, 2, 4, 8)
    assert np.array_equal(run(_shapes, x), x[0])


def _affine(x):
    out = nl.ndarray((64, 8), x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        i_p = nl.arange(32)[:, None]
        i_f = nl.arange(8)[None, :]
        t = nl.load(x[i * 32 + i_p, 2 * i_f + 1])      # strided free-dim gather
        nl.store(out[i * 32 + i_p, i_f], t)
    return out


def test_affine_index_expressions(rng):
    x = f32(rng, 64, 16)
    assert np.array_equal(run(_affine, x), x[:, 1::2])


def _mix(x):
    i_p = nl.arange(4)[:, None]
    return nl.load(x[i_p, 0:8])


def test_mixing_basic_and_advanced_is_rejected(rng):
    with pytest.raises(E.IndexingError, match="mixing of basic tensor indexing and advanced"):
        run(_mix, f32(rng, 4, 8))


def _one_d(x):
    return nl.load(x[nl.arange(4), nl.arange(8)])


def test_1d_arange_is_rejected(rng):
    with pytest.raises(E.IndexingError, match="err_1d_arange_not_supported"):
        run(_one_d, f32(rng, 4, 8))


def _gather(table, idx, *, oob="error", form="col"):
    n, d = idx.shape[0], table.shape[-1]
    assert form != "free" or idx.shape[1] == d
    out = nl.ndarray((n, d), table.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(n)[:, None]
    i_f = nl.arange(d)[None, :]
    it = nl.load(idx)
    dst = nl.full((n, d), -1.0, table.dtype)
    if form == "col":
        src = table[it[i_p, 1], i_f]               # column selected by an int
    elif form == "lead":
        src = table[0, it[i_p, 1], i_f]            # leading int, then the index column
    else:
        src = table[it, i_f]                       # a (n, d) index tile: varies along the free axis
    mode = nisa.oob_mode.skip if oob == "skip" else nisa.oob_mode.error
    nisa.dma_copy(dst=dst[i_p, i_f], src=src, oob_mode=mode)
    nl.store(out, dst)
    return out


def test_indirect_gather_forms(rng):
    table = f32(rng, 50, 16)
    idx = rng.integers(0, 50, (64, 2)).astype(np.int32)
    assert np.array_equal(run(_gather, table, idx), table[idx[:, 1]])
    table3 = table[None]
    assert np.array_equal(run(_gather, table3, idx, form="lead"), table[idx[:, 1]])


def test_indirect_oob_numpy_message_and_skip(rng):
    table = f32(rng, 50, 16)
    idx = rng.integers(0, 50, (64, 2)).astype(np.int32)
    idx[[7, 9], 1] = [53, 60]
    with pytest.raises(IndexError, match=r"^index 848 is out of bounds for axis 0 with size 800$"):
        run(_gather, table, idx)                   # first bad element: row 53 * 16 + col 0
    with nki_sim.tracing() as tr:
        out = run(_gather, table, idx, oob="skip")
    ok = np.ones(64, bool)
    ok[[7, 9]] = False
    assert np.array_equal(out[ok], table[idx[ok, 1]])
    assert np.all(out[~ok] == -1.0)                # skipped rows keep the destination values
    ev = [e for e in tr.events if e.op == "dma_copy"][0]
    assert ev.skipped_rows == 2 and len(ev.descriptor_bytes) == 62 and ev.attr("index_rows") == 62


def test_indirect_index_on_free_axis_is_rejected(rng):
    idx = rng.integers(0, 50, (64, 16)).astype(np.int32)
    with pytest.raises(E.IndexingError, match="err_indirect_indices_free_dim"):
        run(_gather, f32(rng, 50, 16), idx, form="free")


def _idx_in_hbm(table, idx):
    i_p = nl.arange(4)[:, None]
    return nl.load(table[idx[i_p, 0], nl.arange(8)[None, :]])


def test_index_tile_must_be_in_sbuf(rng):
    with pytest.raises(E.MemorySpaceError, match="indices have to be in SBUF"):
        run(_idx_in_hbm, f32(rng, 10, 8), np.zeros((4, 1), np.int32))


def _sbuf_indirect(table, idx):
    it = nl.load(idx)
    t = nl.load(table)
    i_p = nl.arange(4)[:, None]
    return nl.copy(t[it[i_p, 0], nl.arange(8)[None, :]])


def test_indirect_index_into_sbuf_is_rejected(rng):
    with pytest.raises(E.IndexingError, match="err_copy_dynamic_indirect_indices_not_natively_supported"):
        run(_sbuf_indirect, f32(rng, 10, 8), np.zeros((4, 1), np.int32))


def _scatter(base, src, idx):
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(src.shape[1])[None, :]
    it = nl.load(idx)
    nl.store(base[it[i_p, 0], i_f], nl.load(src))
    return base


def test_indirect_store_scatter(rng):
    from nki_sim.legacy.nki_typing import mutable_tensor

    def k(base: mutable_tensor, src, idx):
        return _scatter(base, src, idx)
    base = f32(rng, 20, 8)
    src = f32(rng, 5, 8)
    idx = np.array([[3], [0], [19], [7], [11]], np.int32)
    ref = base.copy()
    ref[idx[:, 0]] = src
    run(k, base, src, idx)
    assert np.array_equal(base, ref)


def _block_dims(x):
    t = nl.zeros((2, nl.par_dim(128), 4), nl.int32)
    out = nl.ndarray((128, 4), nl.int32, buffer=nl.shared_hbm)
    nl.store(out, t[1])
    return out


def test_block_dimensions_follow_the_simulated_sdk():
    x = np.zeros((1, 1), np.int32)
    with nki_sim.configure(sdk="2.26"):
        with pytest.warns(E.BlockDimensionWarning, match="deprecated"):
            assert np.all(run(_block_dims, x) == 0)       # legacy API: deprecated, not removed
        with nki_sim.configure(block_dims="allow"):
            assert np.all(run(_block_dims, x) == 0)
    with pytest.warns(E.BlockDimensionWarning, match="deprecated"):
        assert np.all(run(_block_dims, x) == 0)           # default SDK 2.24: deprecated
    with nki_sim.configure(block_dims="error"), pytest.raises(E.BlockDimensionError):
        run(_block_dims, x)


def _mask_compute(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    t = nl.load(x)
    sq = nl.square(t, mask=((i_p < 64) & (i_f < 8)))
    nl.store(out, nl.zeros(x.shape, x.dtype))
    nl.store(out[i_p, i_f], sq[i_p, i_f], mask=((i_p < 64) & (i_f < 8)))
    return out


def test_masked_compute_and_store(rng):
    x = f32(rng, 128, 16)
    ref = np.zeros_like(x)
    ref[:64, :8] = x[:64, :8] ** 2
    assert np.array_equal(run(_mask_compute, x), ref)


def test_indirect_oob_with_leading_int_names_the_axis(rng):
    idx = np.array([[0, 1], [1, 10], [2, 2]], np.int32)      # row 10 of a 10-row axis
    with pytest.raises(IndexError, match=r"^index 10 is out of bounds for axis 1 with size 10$"):
        run(_gather, f32(rng, 2, 10, 4), idx, form="lead")


def _masks(x, *, kind):
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    t = nl.load(x)
    if kind == "affine":
        m = (i_p < 8) & (2 * i_f + 1 >= 5)
    elif kind == "mod":
        m = i_p % 4 == 0
    else:
        m = i_p * i_f < 3
    r = nl.multiply(t, 2.0, mask=m)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out[i_p, i_f], r[i_p, i_f], mask=m)
    return out


def test_masks_must_be_affine(rng):
    x = f32(rng, 16, 8)
    out = run(_masks, x, kind="affine")
    assert np.array_equal(out[:8, 2:], 2 * x[:8, 2:])
    for kind in ("mod", "product"):
        with pytest.raises(E.NkiCompileError, match="err_unsupported_expression_in_mask"):
            run(_masks, x, kind=kind)


def test_control_flow_on_index_expression_is_rejected():
    def k(x):
        i_p = nl.arange(4)[:, None]
        if i_p < 2:
            pass
    with pytest.raises(ValueError, match="err_control_flow_condition_depending_on_arange"):
        run(k, np.zeros((1, 1), np.float32))


def _load_key(x, *, key):
    t = nl.load(x[key])
    out = nl.ndarray(t.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def test_basic_hbm_indexing_matches_numpy():
    """Random int / slice subscripts of a 3-D HBM tensor load exactly what NumPy selects."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    shape = (4, 6, 5)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

    def axis_index(n):
        ints = st.integers(-n, n - 1)
        sl = st.tuples(st.integers(0, n - 1), st.integers(1, n), st.integers(1, 3)).filter(
            lambda t: t[0] < t[1]).map(lambda t: slice(t[0], t[1], t[2]))
        return st.one_of(ints, sl)

    @settings(max_examples=60, deadline=None)
    @given(st.tuples(axis_index(4), axis_index(6), axis_index(5)))
    def check(key):
        ref = x[key]
        if ref.ndim == 0:
            ref = ref.reshape(1)
        out = run(_load_key, x, key=key)
        assert out.shape == ref.shape and np.array_equal(out, ref)
    check()


def _tile_key(x, *, key):
    t = nl.load(x)
    v = nl.copy(t[key])
    out = nl.ndarray(v.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, v)
    return out


def test_basic_onchip_indexing_keeps_the_partition_axis():
    """On-chip subscripts: NumPy semantics except that the view stays a tile (an int on the
    partition axis keeps size 1; ints on every free axis keep the last one at size 1)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    shape = (8, 6, 5)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

    def axis_index(n):
        sl = st.tuples(st.integers(0, n - 1), st.integers(1, n), st.integers(1, 3)).filter(
            lambda t: t[0] < t[1]).map(lambda t: slice(t[0], t[1], t[2]))
        return st.one_of(st.integers(-n, n - 1), sl)

    @settings(max_examples=60, deadline=None)
    @given(st.tuples(axis_index(8), axis_index(6), axis_index(5)))
    def check(key):
        k0 = key[0] % 8 if isinstance(key[0], int) else key[0]
        ref = x[(slice(k0, k0 + 1) if isinstance(key[0], int) else k0,) + key[1:]]
        if ref.ndim == 1:          # every free axis int-indexed: the last one is kept at size 1
            ref = ref.reshape(ref.shape[0], 1)
        out = run(_tile_key, x, key=key)
        assert out.shape == ref.shape and np.array_equal(out, ref)
    check()


def _affine_load(x, *, P, F, a, b, c, d, n):
    i_p = nl.arange(P)[:, None]
    i_f = nl.arange(F)[None, :]
    t = nl.full((P, F), -1.0, x.dtype)
    t[i_p, i_f] = nl.load(x[a * i_p + b, c * i_f + d], mask=(a * i_p + b < n))
    out = nl.ndarray((P, F), x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def test_affine_advanced_indexing_matches_numpy():
    """Random affine row / column expressions (rows beyond n masked off) vs NumPy fancy indexing."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    x = np.arange(40 * 30, dtype=np.float32).reshape(40, 30)

    @settings(max_examples=60, deadline=None)
    @given(P=st.integers(1, 16), F=st.integers(1, 8), a=st.integers(1, 3), b=st.integers(0, 5),
           c=st.integers(1, 3), d=st.integers(0, 5), n=st.integers(0, 40))
    def check(P, F, a, b, c, d, n):
        rows = a * np.arange(P) + b
        cols = c * np.arange(F) + d
        if cols.max() >= 30:
            with pytest.raises(E.AccessOutOfBoundError, match="dimension 1"):
                run(_affine_load, x, P=P, F=F, a=a, b=b, c=c, d=d, n=n)
            return
        ok = rows < min(n, 40)
        if (rows[rows < n] >= 40).any():
            with pytest.raises(E.AccessOutOfBoundError, match="dimension 0"):
                run(_affine_load, x, P=P, F=F, a=a, b=b, c=c, d=d, n=n)
            return
        out = run(_affine_load, x, P=P, F=F, a=a, b=b, c=c, d=d, n=n)
        ref = np.full((P, F), -1.0, np.float32)
        ref[ok] = x[rows[ok][:, None], cols[None, :]]
        assert np.array_equal(out, ref)
    check()
