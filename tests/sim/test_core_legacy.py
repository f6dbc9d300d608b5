"""Constructs of the AWS/vLLM legacy flash paged-attention kernel (API notes §9), written fresh:
block dimensions (explicitly allowed here; an error with block_dims="error"), block-table transform with
iota / transpose / broadcast, the vectorized KV gather through a block-dim index tile,
(128,)-vs-(128,1) views."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim

from test_core_helpers import nisa, nl, run

P = 128


def _bt_transform(block_tables, kv_cache, *, num_tiles, nb, T, num_head):
    """block_tables (num_tiles*nb,) -> per (load, tile) index columns; gather K rows with them."""
    head_id = nl.program_id(axis=1)
    bt_hbm = block_tables.reshape((num_tiles, nb))
    bt_sbuf = nl.zeros((1, nl.par_dim(P), nb), dtype=nl.int32)
    i_p = nl.arange(P)[:, None]
    i_f = nl.arange(nb)[None, :]
    bt_sbuf[0, i_p, i_f] = nl.load(bt_hbm[i_p, i_f], dtype=nl.int32, mask=(i_p < num_tiles))
    hid = nisa.iota(head_id, dtype=nl.int32).reshape((1, 1))
    hid = nl.transpose(hid.broadcast_to((1, P))).broadcast_to((P, nb))
    offset = nisa.iota(nl.arange(T)[None, None, :], dtype=nl.int32).broadcast_to((P, nb, T))
    part = bt_sbuf[0] * num_head + hid
    part = (part * T).reshape((P, nb, 1)).broadcast_to((P, nb, T))
    new_bt = (part + offset).reshape((P, P))
    bt_t = nl.ndarray((1, nl.par_dim(P), P), dtype=nl.int32)
    j_f = nl.arange(P)[None, :]
    bt_t[0, i_p, j_f] = nl.transpose(new_bt[:, nl.ds(0, P)])
    flat = kv_cache.reshape((kv_cache.shape[0] * kv_cache.shape[1] * T, kv_cache.shape[2] // T * kv_cache.shape[3]))
    out = nl.ndarray((num_tiles, P, flat.shape[1]), kv_cache.dtype, buffer=nl.shared_hbm)
    g_f = nl.arange(flat.shape[1])[None, :]
    for tile in nl.sequential_range(num_tiles):
        loaded = nl.load(flat[bt_t[0, i_p, tile], g_f])
        nl.store(out[tile], loaded)
    return out


def test_vllm_style_block_table_transform_and_gather():
    rng = np.random.default_rng(7)
    N, Hkv, B, d, nb = 40, 2, 16, 8, 32                  # nb blocks per tile, T = 128 / nb = 4
    T = P // nb
    num_tiles = 3
    kv = rng.standard_normal((N, Hkv, B, d)).astype(ml_dtypes.bfloat16)
    bt = rng.integers(0, N, num_tiles * nb).astype(np.int32)
    with nki_sim.configure(block_dims="allow"):
        out = run(_bt_transform, bt, kv, num_tiles=num_tiles, nb=nb, T=T, num_head=Hkv, grid=(1, Hkv))
    # out[tile, q] = rows of block bt[tile*nb + q//T], head 1 (last program), sub-block q%T
    head = Hkv - 1
    q = np.arange(P)
    for tile in range(num_tiles):
        blocks = bt[tile * nb + q // T]
        ref = kv[blocks, head].reshape(P, T, B // T * d)[q, q % T]
        assert np.array_equal(out[tile], ref)


def _stats(x):
    acc = nl.zeros((2, 1, nl.par_dim(P), 1), dtype=nl.float32)
    o_buf = nl.zeros((2, 1, nl.par_dim(P), 4), dtype=nl.float32)
    out = nl.ndarray((2, P, 4), nl.float32, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        t = nl.load(x[i])
        m = acc[i, 0]                                    # (128, 1) tile of a block-dim tensor
        mx = nisa.tensor_reduce(np.max, t, axis=(1,), dtype=nl.float32)   # (128,)
        m[:, 0] = nl.copy(mx)
        alpha = nisa.activation(np.exp, mx, bias=-1 * m[:, 0], scale=1.0)  # exp(0) = 1, (128,)
        o_buf[i, 0][...] = nl.multiply(t, alpha)         # (128, 4) * (128,) left-aligned
        nl.store(out[i], nl.add(o_buf[i, 0], nl.exp(m - m)))
    return out


def test_block_dim_views_and_left_aligned_vectors(rng):
    x = rng.standard_normal((2, P, 4)).astype(np.float32)
    with nki_sim.configure(block_dims="allow"):
        out = run(_stats, x)
    np.testing.assert_allclose(out, x + 1.0, rtol=1e-6)


def test_same_kernel_rejects_block_dims_with_the_strict_setting(rng):
    with nki_sim.configure(sdk="2.26", block_dims="error"), pytest.raises(
            SyntaxError, match="err_leading_dimension_of_tensor_must_be_partition"):
        run(_stats, rng.standard_normal((2, P, 4)).astype(np.float32))
