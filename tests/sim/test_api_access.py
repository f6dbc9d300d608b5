"""HBM access forms used by the paged-attention kernels: indices computed on chip, uint32
index tiles, index tiles from PSUM (rejected), leading integer subscripts of direct loads,
masks with program ids, and the documented static out-of-bound message."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation


@nki.jit
def computed_index_gather_k(data, block_table, *, heads, head_id):
    """Rows (block_table[p] * heads + head_id) of data: the index tile is int32 arithmetic on SBUF."""
    width = data.shape[1]
    out = nl.ndarray((block_table.shape[0], width), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(block_table.shape[0])[:, None]
    i_f = nl.arange(width)[None, :]
    bt = nl.load(block_table)
    # explicit dtype: a Python int is a weak int32, and (uint32, int32) promotes to float32
    rows = nl.add(nl.multiply(bt, heads, dtype=bt.dtype), head_id, dtype=bt.dtype)
    nl.store(out, value=nl.load(data[rows[i_p, 0], i_f]))
    return out


@pytest.mark.parametrize("idx_dtype", [np.int32, np.uint32])
def test_gather_with_index_computed_on_chip(rng, idx_dtype):
    heads, n_blocks = 4, 30
    data = rng.standard_normal((n_blocks * heads, 16)).astype(ml_dtypes.bfloat16)
    bt = rng.integers(0, n_blocks, size=(128, 1)).astype(idx_dtype)
    out = nki.simulate_kernel(computed_index_gather_k, data, bt, heads=heads, head_id=3)
    rows = bt[:, 0].astype(np.int64) * heads + 3
    np.testing.assert_array_equal(out.view(np.uint16), data[rows].view(np.uint16))


@nki.jit
def transposed_index_gather_k(data, idx_row, *, via_psum):
    """idx_row (1, P) int32 transposed on chip to a (P, 1) index tile, then used for a gather;
    the index tile must be in SBUF."""
    width = data.shape[1]
    n_idx = idx_row.shape[1]
    out = nl.ndarray((n_idx, width), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(n_idx)[:, None]
    i_f = nl.arange(width)[None, :]
    row = nl.load(idx_row)
    if via_psum:
        col = nl.ndarray((n_idx, 1), dtype=nl.int32, buffer=nl.psum)
    else:
        col = nl.ndarray((n_idx, 1), dtype=nl.int32, buffer=nl.sbuf)
    col[...] = nl.transpose(row)
    nl.store(out, value=nl.load(data[col[i_p, 0], i_f]))
    return out


def test_index_tile_from_transpose_in_sbuf_passes_in_psum_fails(rng, rejects):
    data = rng.standard_normal((200, 8)).astype(np.float32)
    idx = rng.integers(0, 200, size=(1, 128)).astype(np.int32)
    out = nki.simulate_kernel(transposed_index_gather_k, data, idx, via_psum=False)
    np.testing.assert_array_equal(out, data[idx[0]])
    with rejects(Exception, match=r"(?i)sbuf|psum|indirect"):
        nki.simulate_kernel(transposed_index_gather_k, data, idx, via_psum=True)


@nki.jit
def leading_int_load_k(q, *, batch, head):
    """q (B, H, d, S) -> the (d, S) tile q[batch, head] and the half tile q[batch, head, :, 0:S/2]."""
    d, s = q.shape[2], q.shape[3]
    o_full = nl.ndarray((d, s), dtype=q.dtype, buffer=nl.shared_hbm)
    o_half = nl.ndarray((d, s // 2), dtype=q.dtype, buffer=nl.shared_hbm)
    nl.store(o_full, value=nl.load(q[batch, head]))
    nl.store(o_half, value=nl.load(q[batch, head, :, 0:s // 2]))
    return o_full, o_half


def test_direct_load_with_leading_integer_subscripts(rng):
    q = rng.standard_normal((2, 3, 64, 40)).astype(np.float32)
    full, half = nki.simulate_kernel(leading_int_load_k, q, batch=1, head=2)
    np.testing.assert_array_equal(full, q[1, 2])
    np.testing.assert_array_equal(half, q[1, 2, :, :20])


@nki.jit
def program_masked_load_k(x):
    """Program i of a 1-D grid loads rows [64 i, 64 i + 64) of x masked to rows < x.shape[0],
    into a tile pre-filled with -1, and stores the whole 64-row tile."""
    n_rows, width = x.shape
    pid = nl.program_id(0)
    out = nl.ndarray((nl.num_programs(0) * 64, width), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(64)[:, None]
    i_f = nl.arange(width)[None, :]
    tile = nl.full((64, width), -1.0, dtype=x.dtype)
    tile[i_p, i_f] = nl.load(x[pid * 64 + i_p, i_f], mask=(pid * 64 + i_p < n_rows))
    nl.store(out[pid * 64 + i_p, i_f], value=tile)
    return out


def test_mask_with_program_id(rng):
    x = rng.standard_normal((150, 4)).astype(np.float32)
    out = nki.simulate_kernel(program_masked_load_k[3], x)
    assert out.shape == (192, 4)
    np.testing.assert_array_equal(out[:150], x)
    np.testing.assert_array_equal(out[150:], -1.0)


@nki.jit
def free_axis_oob_k(x, *, cols):
    out = nl.ndarray((x.shape[0], cols), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x[:, 0:cols]))
    return out


def test_static_out_of_bound_on_the_free_axis(rng, rejects):
    x = rng.standard_normal((8, 4000)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(free_axis_oob_k, x, cols=4000), x)
    # documented: "Out-of-bound access for tensor `x` on dimension 1: index range [0, 4095]
    # exceed dimension size of 4000"
    msg = "Out-of-bound access for tensor `x` on dimension 1: index range [0, 4095] exceed dimension size of 4000"
    with rejects(Exception, match=re.escape(msg)):
        nki.simulate_kernel(free_axis_oob_k, x, cols=4096)


@nki.jit
def ds_oob_k(x, *, start):
    out = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x[nl.ds(start, 128), :]))
    return out


def test_dynamic_slice_past_the_end_fails(rng, rejects):
    x = rng.standard_normal((300, 4)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(ds_oob_k, x, start=172), x[172:])
    with rejects(Exception, match=r"(?i)out-of-bound|out of bound"):
        nki.simulate_kernel(ds_oob_k, x, start=173)


@nki.jit
def matmul_mixed_k(x, y):
    out = nl.ndarray((x.shape[1], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.copy(nl.matmul(nl.load(x), nl.load(y), transpose_x=True)))
    return out


def test_nl_matmul_mixed_fp32_bf16_fails(rng, rejects):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    y = rng.standard_normal((32, 8)).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(nki.simulate_kernel(matmul_mixed_k, x, y.astype(np.float32)),
                               x.astype(np.float64).T @ y.astype(np.float64), rtol=1e-5, atol=1e-5)
    with rejects(Exception, match=r"(?i)fp32|float32|dtype"):
        nki.simulate_kernel(matmul_mixed_k, x, y)


@nki.jit
def adv_index_k(x, *, swap):
    """x (P, 64) -> (P, 8, 8) tile through 3-D arange expressions: x[p, 8a + b] (row-major)
    or x[p, a + 8b] (swapped free axes)."""
    p_dim = x.shape[0]
    out = nl.ndarray((p_dim, 8, 8), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(p_dim)[:, None, None]
    i_a = nl.arange(8)[None, :, None]
    i_b = nl.arange(8)[None, None, :]
    cols = (i_a + 8 * i_b) if swap else (8 * i_a + i_b)
    tile = nl.load(x[i_p, cols])
    assert tuple(tile.shape) == (p_dim, 8, 8)
    nl.store(out, value=tile)
    return out


@pytest.mark.parametrize("swap", [False, True])
def test_advanced_index_expressions_give_numpy_shapes(rng, swap):
    x = rng.standard_normal((32, 64)).astype(np.float32)
    out = nki.simulate_kernel(adv_index_k, x, swap=swap)
    ref = x.reshape(32, 8, 8)
    np.testing.assert_array_equal(out, ref.transpose(0, 2, 1) if swap else ref)
