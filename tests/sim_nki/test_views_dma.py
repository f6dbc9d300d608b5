"""Views, access patterns and DMA (gather / scatter with oob skip, transpose, compute)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from sim_nki_util import load, nisa, nki, nl, out_of, sb
from nki_sim.current.checks import NkiValidationError
from nki_sim.errors import AccessOutOfBoundError, IndirectIndexError

BF16 = ml_dtypes.bfloat16


def test_indexing_rules_and_views(rng):
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)

    @nki.jit
    def k(x):
        t = load(x)
        shapes = [t[:, 0, 3].shape, t[1, 2:4].shape, t[:, 1].shape, x[1].shape, x[1, 2].shape,
                  t.permute((0, 2, 1)).shape, t[:, :, 0:1].broadcast(2, 5).shape,
                  t.reshape((4, 48)).shape, x.reshape((24, 8))[3:5].shape]
        sl = sb((4, 3, 4))
        nisa.tensor_copy(dst=sl, src=t[:, ::2, nl.ds(2, 4)])
        pm = sb((4, 8, 6))
        nisa.tensor_copy(dst=pm, src=t.permute((0, 2, 1)))
        bc = sb((4, 6, 5))
        nisa.tensor_copy(dst=bc, src=t[:, :, 0:1].broadcast(2, 5))
        ap = sb((4, 3, 2))
        nisa.tensor_copy(dst=ap, src=t.ap([[48, 4], [16, 3], [2, 2]], offset=1))
        return shapes, out_of(sl), out_of(pm), out_of(bc), out_of(ap)

    shapes, sl, pm, bc, ap = k(x)
    assert list(shapes) == [(4, 1), (1, 2, 8), (4, 8), (6, 8), (8,), (4, 8, 6), (4, 6, 5), (4, 48), (2, 8)]
    np.testing.assert_array_equal(sl, x[:, ::2, 2:6])
    np.testing.assert_array_equal(pm, x.transpose(0, 2, 1))
    np.testing.assert_array_equal(bc, np.broadcast_to(x[:, :, 0:1], (4, 6, 5)))
    p, i, j = np.ix_(range(4), range(3), range(2))
    np.testing.assert_array_equal(ap, x.reshape(-1)[1 + 48 * p + 16 * i + 2 * j])


def test_dtype_view_shares_storage():
    x = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)

    @nki.jit
    def k(x):
        t = load(x)
        u = sb((8, 4), nl.int32)
        nisa.tensor_copy(dst=u, src=t.view(nl.int32))
        h = sb((8, 8), nl.bfloat16)
        nisa.tensor_copy(dst=h, src=t.view(nl.bfloat16))
        return out_of(u), out_of(h)

    u, h = k(x)
    np.testing.assert_array_equal(u, x.view(np.int32))
    np.testing.assert_array_equal(h.view(np.uint16), x.view(np.uint16).reshape(8, 8))


def test_static_out_of_bounds_text():
    x = np.zeros((32, 8), np.float32)

    @nki.jit
    def k(x):
        return load(x[0:128])

    with pytest.raises(AccessOutOfBoundError, match=r"Out-of-bound access for tensor `x` on dimension 0: "
                                                    r"index range \[0, 127\] exceed dimension size of 32"):
        k(x)


def _gather_kernel(data, idx, skip=True, dge=None):
    P, F = idx.shape[0], data.shape[1]
    it = load(idx)
    t = sb((P, F), data.dtype)
    nisa.memset(dst=t, value=7.0)
    kw = {} if dge is None else {"dge_mode": dge}
    nisa.dma_copy(dst=t, src=data.ap([[F, P], [1, F]], vector_offset=it, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip if skip else nisa.oob_mode.error, **kw)
    return out_of(t)


def test_gather_skips_out_of_bounds_rows(rng):
    data = rng.standard_normal((10, 16)).astype(BF16)
    idx = np.array([[3], [0xFFFFFFFF], [9], [0]], np.uint32)
    with nki_sim.tracing() as tr:
        g = nki.jit(_gather_kernel)(data, idx)
    np.testing.assert_array_equal(g[[0, 2, 3]], data[[3, 9, 0]])
    np.testing.assert_array_equal(g[1], np.full(16, 7.0, BF16))
    ev = [e for e in tr.events if e.dma_kind == "indirect"]
    assert len(ev) == 1 and ev[0].skipped_rows == 1 and ev[0].bytes == 3 * 16 * 2
    assert len(ev[0].descriptor_bytes) == 3


def test_gather_error_mode_raises():
    data = np.zeros((10, 4), np.float32)
    idx = np.array([[10]], np.int32)
    with pytest.raises(IndirectIndexError, match="out of bounds"):
        nki.jit(_gather_kernel)(data, idx, False)


def test_scatter_with_skip_writes_input_in_place(rng):
    cache = np.zeros((8, 4), np.float32)
    v = rng.standard_normal((3, 4)).astype(np.float32)
    slots = np.array([[5], [-1], [2]], np.int32)

    @nki.jit
    def k(cache, v, slots):
        tv, ts = load(v), load(slots)
        nisa.dma_copy(dst=cache.ap([[4, 3], [1, 4]], vector_offset=ts, indirect_dim=0), src=tv,
                      oob_mode=nisa.oob_mode.skip)
        return cache

    r = k(cache, v, slots)
    ref = np.zeros((8, 4), np.float32)
    ref[5], ref[2] = v[0], v[2]
    np.testing.assert_array_equal(cache, ref)
    assert r is cache


def test_scalar_offset_block_copy(rng):
    blocks = rng.standard_normal((6, 2, 4)).astype(np.float32)
    ids = np.array([[4, 1]], np.int32)

    @nki.jit
    def k(blocks, ids):
        ti = load(ids)
        for j in range(2):
            t = sb((2, 4))
            nisa.dma_copy(dst=t, src=blocks.ap([[4, 2], [1, 4]], offset=0, scalar_offset=ti[0:1, j:j + 1],
                                               indirect_dim=0), dge_mode=nisa.dge_mode.hwdge)
            nisa.dma_copy(dst=blocks[j], src=t)
        return blocks

    k(blocks.copy(), ids)
    out = blocks.copy()
    k(out, ids)
    np.testing.assert_array_equal(out[0], blocks[4])
    np.testing.assert_array_equal(out[1], blocks[1])


def test_dma_transpose_direct_and_indirect(rng):
    x = rng.standard_normal((16, 64)).astype(BF16)
    kv = rng.standard_normal((40, 8, 16)).astype(BF16)          # (blocks, block_len, d)
    ids = rng.permutation(40)[:16].astype(np.uint32).reshape(16, 1)

    @nki.jit
    def k(x, kv, ids):
        t = sb((64, 16), nl.bfloat16)
        nisa.dma_transpose(dst=t, src=x)
        ti = load(ids)
        kt = sb((16, 1, 8, 16), nl.bfloat16)
        nisa.dma_transpose(dst=kt, src=kv.ap([[128, 16], [1, 1], [16, 8], [1, 16]], vector_offset=ti,
                                             indirect_dim=0), axes=(3, 1, 2, 0),
                           dge_mode=nisa.dge_mode.swdge)
        return out_of(t), out_of(kt)

    t, kt = k(x, kv, ids)
    np.testing.assert_array_equal(t, x.T)
    ref = kv[ids[:, 0]].reshape(16, 1, 8, 16).transpose(3, 1, 2, 0)
    np.testing.assert_array_equal(kt, ref)



@pytest.mark.parametrize("rank", [3, 4])
def test_dma_transpose_of_sbuf_block_views(rng, rank):
    # an SBUF source read as (rows, [1,] blocks, width) column blocks, written as (width, [1,]
    # blocks, rows): every block transposed in one DMA (axes (2, 1, 0) / (3, 1, 2, 0)); columns
    # outside stay as they were
    rows, n, w = 24, 3, 32
    x = rng.standard_normal((rows, (n + 1) * w)).astype(BF16)
    one = [[1, 1]] if rank == 4 else []
    axes = (3, 1, 2, 0) if rank == 4 else (2, 1, 0)

    @nki.jit
    def k(x):
        src = load(x)
        dst = sb((w, (n + 1) * rows), nl.bfloat16)
        nisa.memset(dst=dst, value=0.0)
        nisa.dma_transpose(dst=dst.ap([[(n + 1) * rows, w]] + one + [[rows, n], [1, rows]],
                                      offset=rows),
                           src=src.ap([[(n + 1) * w, rows]] + one + [[w, n], [1, w]], offset=w),
                           axes=axes)
        return out_of(dst)

    got = k(x)
    assert not got[:, :rows].astype(np.float32).any()
    for u in range(n):
        np.testing.assert_array_equal(got[:, (u + 1) * rows:(u + 2) * rows],
                                      x[:, (u + 1) * w:(u + 2) * w].T)


def test_dma_transpose_needs_neuroncore_v3(rng):
    from nki_sim.errors import TargetError

    x = rng.standard_normal((16, 32)).astype(BF16)

    @nki.jit
    def k(x):
        t = sb((32, 16), nl.bfloat16)
        nisa.dma_transpose(dst=t, src=load(x))
        return out_of(t)

    np.testing.assert_array_equal(k(x), x.T)          # trn2 (the default target)
    with nki_sim.use_target("trn1"), pytest.warns(UserWarning, match="trn2 / trn3 only"), \
            pytest.raises(TargetError, match="NeuronCore-v3"):
        k(x)

def test_dma_compute_scatter_add(rng):
    acc = rng.standard_normal((6, 4)).astype(np.float32)
    v = rng.standard_normal((2, 4)).astype(np.float32)
    rows = np.array([[4], [1]], np.int32)
    ref = acc.astype(np.float64).copy()
    ref[[4, 1]] += v

    @nki.jit
    def k(acc, v, rows):
        tv, tr = load(v), load(rows)
        dst = acc.ap([[4, 2], [1, 4]], vector_offset=tr, indirect_dim=0)
        nisa.dma_compute(dst=dst, srcs=[tv, dst], reduce_op=nl.add)
        return acc

    k(acc, v, rows)
    np.testing.assert_allclose(acc, ref, rtol=1e-6)


def test_onchip_ap_partition_step_rule():
    x = np.zeros((8, 4), np.float32)

    @nki.jit
    def ok(x):
        t = load(x)
        return t.ap([[4, 4], [1, 4]], offset=8).shape

    @nki.jit
    def bad(x):
        t = load(x)
        return t.ap([[8, 4], [1, 4]])

    assert ok(x) == (4, 4)
    with pytest.raises(Exception, match="partition step"):
        bad(x)
    _ = NkiValidationError
