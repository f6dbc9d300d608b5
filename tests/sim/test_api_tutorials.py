"""Tutorial-style kernels (tests/sim/kernels/*.py, written for real NKI) against NumPy.

Every expected value is computed here from the definition in float64 / exact integer math.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki

pytestmark = pytest.mark.simulation

BF16 = ml_dtypes.bfloat16


def bf16_rne_bits(x32: np.ndarray) -> np.ndarray:
    """Round float32 values to bf16 by round-to-nearest-even on the bit pattern (finite inputs)."""
    bits = np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    return ((bits + 0x7FFF + lsb) >> 16).astype(np.uint16)


# --------------------------------------------------------------------------- SPMD add, grid ids
def test_spmd_tensor_add_matches_numpy(tutorial, rng):
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((256, 512)).astype(np.float32)
    out = nki.simulate_kernel(tutorial.spmd_tensor_add[2, 2], a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) + b, rtol=0, atol=1e-6)


def test_spmd_tensor_add_needs_the_whole_grid(tutorial, rng):
    # a 1x1 launch only covers the first tile; the rest of the output is never written,
    # so the result must differ from a + b (guards against a grid that is ignored).
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((256, 512)).astype(np.float32)
    out = nki.simulate_kernel(tutorial.spmd_tensor_add[1, 1], a, b)
    np.testing.assert_allclose(out[:128, :256], a[:128, :256] + b[:128, :256], atol=1e-6)
    assert not np.allclose(out[128:], a[128:] + b[128:])


def test_grid_program_ids_and_counts(tutorial):
    g0, g1 = 2, 3
    out = nki.simulate_kernel(tutorial.grid_coordinates[g0, g1], np.zeros((g0 * g1, 5), np.int32))
    expected = np.array([[i, j, g0 * g1, g1, 2] for i in range(g0) for j in range(g1)], np.int32)
    np.testing.assert_array_equal(out, expected)


# --------------------------------------------------------------------------- matmul
@pytest.mark.parametrize("kernel_name", ["tiled_matmul", "tiled_matmul_isa"])
def test_tiled_matmul_psum_accumulation(tutorial, rng, kernel_name):
    k_dim, m_dim, n_dim = 384, 256, 1024          # 3 K tiles accumulated in PSUM
    lhs_t = rng.standard_normal((k_dim, m_dim)).astype(np.float32)
    rhs = rng.standard_normal((k_dim, n_dim)).astype(np.float32)
    out = nki.simulate_kernel(getattr(tutorial, kernel_name), lhs_t, rhs)
    ref = lhs_t.astype(np.float64).T @ rhs.astype(np.float64)
    assert out.shape == (m_dim, n_dim) and out.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


def test_tiled_matmul_bf16_inputs_accumulate_in_fp32(tutorial, rng):
    lhs_t = rng.standard_normal((256, 128)).astype(BF16)
    rhs = rng.standard_normal((256, 512)).astype(BF16)
    out = nki.simulate_kernel(tutorial.tiled_matmul, lhs_t, rhs)
    ref = lhs_t.astype(np.float64).T @ rhs.astype(np.float64)   # bf16 products are exact
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_matmul_without_transpose_x(tutorial, rng):
    x = rng.standard_normal((64, 96)).astype(np.float32)
    y = rng.standard_normal((96, 200)).astype(np.float32)
    out = nki.simulate_kernel(tutorial.matmul_plain, x, y)
    np.testing.assert_allclose(out, x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- transpose
def test_transpose_nl_tensor_engine_and_vector_engine(tutorial, rng):
    x = rng.standard_normal((32, 24)).astype(np.float32)
    via_nl, via_pe, via_ve = nki.simulate_kernel(tutorial.transpose_three_ways, x)
    for res in (via_nl, via_pe, via_ve):
        assert res.shape == (24, 32)
        np.testing.assert_array_equal(res, x.T)


def test_transpose_128_by_96(tutorial, rng):
    x = rng.standard_normal((128, 96)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(tutorial.transpose_large, x), x.T)


# --------------------------------------------------------------------------- softmax / layernorm
def test_row_softmax(tutorial, rng):
    x = (rng.standard_normal((128, 384)) * 4).astype(np.float32)
    out = nki.simulate_kernel(tutorial.row_softmax, x)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-5)


def test_row_layernorm(tutorial, rng):
    x = rng.standard_normal((100, 256)).astype(np.float32) * 3 + 1
    gamma = rng.standard_normal((1, 256)).astype(np.float32)
    out = nki.simulate_kernel(tutorial.row_layernorm, x, gamma)
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(axis=1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(var + 1e-5) * gamma
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- int32 + iota
def test_int32_arithmetic_with_iota(tutorial):
    rows, cols, mul, add = 128, 512, 3, 7     # all values < 2**24: exact even through fp32
    affine, low_byte, shifted = nki.simulate_kernel(
        tutorial.iota_int_arith, rows=rows, cols=cols, mul=mul, add=add)
    idx = np.arange(rows, dtype=np.int64)[:, None] * cols + np.arange(cols)[None, :]
    for res in (affine, low_byte, shifted):
        assert res.dtype == np.int32
    np.testing.assert_array_equal(affine, idx * mul + add - idx)
    np.testing.assert_array_equal(low_byte, idx & 255)
    np.testing.assert_array_equal(shifted, idx >> 3)


# --------------------------------------------------------------------------- bf16 rounding
def _rounding_cases(rng) -> np.ndarray:
    """(128, 80) fp32: values exactly half-way between two bf16 values with an even and an
    odd bf16 last bit, values just below / above such ties, and random normals."""
    shape = (128, 16)
    sign = rng.integers(0, 2, size=shape).astype(np.uint32) << 31
    expo = rng.integers(100, 150, size=shape).astype(np.uint32) << 23
    mant7 = rng.integers(0, 128, size=shape).astype(np.uint32) << 16
    hi = sign | expo | mant7
    even_ties = ((hi & ~np.uint32(0x10000)) | 0x8000).view(np.float32)
    odd_ties = (hi | 0x10000 | 0x8000).view(np.float32)
    below = (hi | 0x7FFF).view(np.float32)
    above = (hi | 0x8001).view(np.float32)
    rnd = rng.standard_normal(shape).astype(np.float32)
    return np.concatenate([even_ties, odd_ties, below, above, rnd], axis=1)


def test_bf16_round_to_nearest_even_on_every_write_path(tutorial, rng):
    x = _rounding_cases(rng)
    expected_bits = bf16_rne_bits(x)
    # the reference formula agrees with ml_dtypes' own RNE cast
    np.testing.assert_array_equal(expected_bits, x.astype(BF16).view(np.uint16))
    outs = nki.simulate_kernel(tutorial.bf16_write_paths, x)
    for name, res in zip(["assign", "load dtype", "nl.copy dtype", "store fp32->bf16"], outs):
        assert res.dtype == np.dtype(BF16), name
        np.testing.assert_array_equal(res.view(np.uint16), expected_bits, err_msg=name)


def test_bf16_truncation_would_be_detected(rng):
    # the tie inputs really do distinguish RNE from truncation and from round-half-up
    x = _rounding_cases(rng)[:, :64]
    bits = x.view(np.uint32)
    truncated = (bits >> 16).astype(np.uint16)
    half_up = ((bits + 0x8000) >> 16).astype(np.uint16)
    rne = bf16_rne_bits(x)
    assert (truncated != rne).any() and (half_up != rne).any()


def test_bf16_add_rounds_once_from_fp32(tutorial, rng):
    a = rng.standard_normal((128, 96)).astype(BF16)
    b = (rng.standard_normal((128, 96)) * 1e-2).astype(BF16)
    out = nki.simulate_kernel(tutorial.bf16_add, a, b)
    in_fp32 = a.astype(np.float32) + b.astype(np.float32)   # Vector math in fp32 ...
    np.testing.assert_array_equal(out.view(np.uint16), bf16_rne_bits(in_fp32))  # ... one RNE
