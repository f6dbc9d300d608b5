"""Rank and broadcasting of on-chip tiles as AWS legacy kernels use them: reductions that
drop the free axis ((P,) results), integer-indexed columns ``t[:, k]`` of (P, K) tiles,
reduce results written into columns, and kwargs / 3-D HBM views at the kernel boundary.

The legacy rule adopted by the project (API notes section 3.2): a lower-rank on-chip tile
is left-aligned against its partner -- the partition axis always aligns with the partition
axis, so (P,) behaves as (P, 1). Square tiles (F == P) make a right-aligned NumPy broadcast
give a silently wrong answer instead of an error, so they are used on purpose.
"""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation


@nki.jit
def subtract_row_max_k(x):
    """x (P, P): x - max over the free axis, with the (P,) reduction result (no keepdims)."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    row_max = nl.max(tile, axis=1)
    nl.store(out, value=nl.subtract(tile, row_max))
    return out


def test_reduction_result_broadcasts_along_the_free_axis(rng):
    x = rng.standard_normal((128, 128)).astype(np.float32)
    out = nki.simulate_kernel(subtract_row_max_k, x)
    np.testing.assert_array_equal(out, x - x.max(axis=1, keepdims=True))


@nki.jit
def scale_by_column_k(x, s):
    """x (P, P) * s[:, k] for k = 1 of an s (P, 3) tile (integer-indexed column)."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    scales = nl.load(s)
    nl.store(out, value=nl.multiply(tile, scales[:, 1]))
    return out


def test_integer_indexed_column_scales_rows(rng):
    x = rng.standard_normal((128, 128)).astype(np.float32)
    s = rng.standard_normal((128, 3)).astype(np.float32)
    out = nki.simulate_kernel(scale_by_column_k, x, s)
    np.testing.assert_allclose(out, x.astype(np.float64) * s[:, 1:2], rtol=1e-6)


@nki.jit
def column_reductions_k(x):
    """x (P, K*F): per-block max written into column k of a (P, K) tile in an affine_range,
    then activation_reduce sums written into column k of another (P, K) tile."""
    n_blocks = 4
    width = x.shape[1] // n_blocks
    o_max = nl.ndarray((x.shape[0], n_blocks), dtype=nl.float32, buffer=nl.shared_hbm)
    o_sum = nl.ndarray((x.shape[0], n_blocks), dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    maxes = nl.ndarray((x.shape[0], n_blocks), dtype=nl.float32, buffer=nl.sbuf)
    sums = nl.ndarray((x.shape[0], n_blocks), dtype=nl.float32, buffer=nl.sbuf)
    for k in nl.affine_range(n_blocks):
        maxes[:, k] = nisa.tensor_reduce(np.max, tile[:, nl.ds(k * width, width)], axis=(1,),
                                         dtype=nl.float32, negate=False)
    for k in nl.affine_range(n_blocks):
        nisa.activation_reduce(np.exp, tile[:, nl.ds(k * width, width)], reduce_op=nl.add,
                               reduce_res=sums[:, k], bias=None, scale=1.0)
    nl.store(o_max, value=maxes)
    nl.store(o_sum, value=sums)
    return o_max, o_sum


def test_reductions_written_into_columns(rng):
    x = rng.standard_normal((128, 4 * 32)).astype(np.float32)
    o_max, o_sum = nki.simulate_kernel(column_reductions_k, x)
    blocks = x.astype(np.float64).reshape(128, 4, 32)
    np.testing.assert_array_equal(o_max, blocks.max(axis=2))
    np.testing.assert_allclose(o_sum, np.exp(blocks).sum(axis=2), rtol=1e-5)


@nki.jit
def activation_column_bias_k(x, m):
    """exp(x - m[:, 0]) with the bias built as -1 * (P, 1) tile, the flash-attention idiom."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    m_tile = nl.load(m)
    neg = -1 * m_tile[:, 0]
    nl.store(out, value=nisa.activation(np.exp, tile, bias=neg, scale=1.0))
    return out


def test_activation_bias_from_a_column_view(rng):
    x = rng.standard_normal((128, 128)).astype(np.float32)
    m = rng.standard_normal((128, 2)).astype(np.float32)
    out = nki.simulate_kernel(activation_column_bias_k, x, m)
    np.testing.assert_allclose(out, np.exp(x.astype(np.float64) - m[:, :1]), rtol=1e-5)


# --------------------------------------------------------------------------- kernel boundary
@nki.jit
def add_k(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.add(nl.load(a), nl.load(b)))
    return out


def test_array_arguments_passed_as_keywords_to_a_grid_launch(rng):
    # vLLM launches flash_paged_attention[1, n_kv_head](**kwargs) with every tensor a kwarg
    a = rng.standard_normal((64, 8)).astype(np.float32)
    b = rng.standard_normal((64, 8)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(add_k[1, 1], a=a, b=b), a + b, rtol=1e-6)
    np.testing.assert_allclose(nki.simulate_kernel(add_k, b=b, a=a), a + b, rtol=1e-6)


@nki.jit
def cache_gather_k(kv_cache, idx, *, which):
    """kv_cache (2, N, F) HBM; gather rows idx of kv_cache[which] with a leading int subscript."""
    width = kv_cache.shape[2]
    out = nl.ndarray((idx.shape[0], width), dtype=kv_cache.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(width)[None, :]
    idx_tile = nl.load(idx)
    nl.store(out, value=nl.load(kv_cache[which, idx_tile[i_p, 0], i_f]))
    return out


@pytest.mark.parametrize("which", [0, 1])
def test_gather_with_leading_integer_subscript(rng, which):
    kv = rng.standard_normal((2, 50, 24)).astype(np.float32)
    idx = rng.integers(0, 50, size=(128, 1)).astype(np.int32)
    out = nki.simulate_kernel(cache_gather_k, kv, idx, which=which)
    np.testing.assert_array_equal(out, kv[which][idx[:, 0]])


@nki.jit
def reshaped_cache_gather_k(kv_cache, idx, *, tiling):
    """kv_cache (2, N, H, B, d) viewed as (2, N*H*tiling, B//tiling*d) and gathered by row
    (the vLLM vectorised KV load)."""
    two, n_blocks, heads, bsz, d = kv_cache.shape
    rows = n_blocks * heads * tiling
    width = bsz // tiling * d
    flat = kv_cache.reshape((two, rows, width))
    out = nl.ndarray((idx.shape[0], width), dtype=kv_cache.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(width)[None, :]
    idx_tile = nl.load(idx)
    nl.store(out, value=nl.load(flat[1, idx_tile[i_p, 0], i_f]))
    return out


def test_gather_from_reshaped_5d_cache(rng):
    kv = rng.standard_normal((2, 6, 2, 8, 4)).astype(np.float32)
    tiling = 2
    idx = rng.integers(0, 6 * 2 * tiling, size=(128, 1)).astype(np.int32)
    out = nki.simulate_kernel(reshaped_cache_gather_k, kv, idx, tiling=tiling)
    ref = kv.reshape(2, 6 * 2 * tiling, 8 // tiling * 4)[1][idx[:, 0]]
    np.testing.assert_array_equal(out, ref)


@nki.jit
def masked_indirect_k(data, idx, *, n_valid):
    """Gather rows idx[p] only for p < n_valid; the other rows of the tile keep -1."""
    width = data.shape[1]
    out = nl.ndarray((idx.shape[0], width), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(width)[None, :]
    idx_tile = nl.load(idx)
    tile = nl.full((idx.shape[0], width), -1.0, dtype=data.dtype)
    tile[i_p, i_f] = nl.load(data[idx_tile[i_p, 0], i_f], mask=(i_p < n_valid))
    nl.store(out, value=tile)
    return out


def test_masked_indirect_gather_ignores_masked_indices(rng):
    data = rng.standard_normal((40, 16)).astype(np.float32)
    idx = rng.integers(0, 40, size=(128, 1)).astype(np.int32)
    idx[100:] = 10_000                      # out of bounds, but masked out
    out = nki.simulate_kernel(masked_indirect_k, data, idx, n_valid=100)
    np.testing.assert_array_equal(out[:100], data[idx[:100, 0]])
    np.testing.assert_array_equal(out[100:], -1.0)


@nki.jit
def view_writes_k(x):
    """Writes through composed views of one SBUF tile t (128, 64) fp32 holding x:
    t[:, 16:48].reshape((128, 4, 8))[:, 1, :] = -1 ; t.view(int32)[:, 0:4] = 7 ;
    t[:, 48:64:2] = 5 (strided free slice)."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    t[...] = nl.load(x)
    blocks = t[:, 16:48].reshape((x.shape[0], 4, 8))
    blocks[:, 1, :] = -1.0
    t.view(nl.int32)[:, 0:4] = 7
    t[:, 48:64:2] = 5.0
    nl.store(out, value=t)
    return out


def test_writes_through_composed_views(rng):
    x = rng.standard_normal((128, 64)).astype(np.float32)
    out = nki.simulate_kernel(view_writes_k, x)
    ref = x.copy()
    ref[:, 24:32] = -1.0
    ref.view(np.int32)[:, 0:4] = 7
    ref[:, 48:64:2] = 5.0
    np.testing.assert_array_equal(out.view(np.int32), ref.view(np.int32))
