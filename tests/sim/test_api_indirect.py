"""Indirect gather / scatter, out-of-bounds modes, masked loads and stores (kernels in
tests/sim/kernels/indirect_kernels.py, written for real NKI)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation


def _oob_message(first_bad_row: int, n_rows: int, width: int) -> str:
    """The documented NumPy-style message for the first out-of-range element of the
    flattened HBM tensor (legacy simulator, API notes section 3.5)."""
    return re.escape(f"index {first_bad_row * width} is out of bounds for axis 0 "
                     f"with size {n_rows * width}")


# --------------------------------------------------------------------------- gather
@pytest.mark.parametrize("kernel_name", ["gather_rows", "gather_rows_tile_index"])
def test_indirect_gather_nl_load(indirect, rng, kernel_name):
    data = rng.standard_normal((300, 48)).astype(np.float32)
    idx = rng.integers(0, 300, size=(128, 1)).astype(np.int32)
    out = nki.simulate_kernel(getattr(indirect, kernel_name), data, idx)
    np.testing.assert_array_equal(out, data[idx[:, 0]])


def test_indirect_gather_fewer_partitions_bf16(indirect, rng):
    data = rng.standard_normal((40, 96)).astype(ml_dtypes.bfloat16)
    idx = rng.permutation(40)[:17].reshape(17, 1).astype(np.int32)
    out = nki.simulate_kernel(indirect.gather_rows, data, idx)
    np.testing.assert_array_equal(out.view(np.uint16), data[idx[:, 0]].view(np.uint16))


def test_indirect_gather_nl_load_out_of_bounds_raises(indirect, rng, rejects):
    data = rng.standard_normal((300, 48)).astype(np.float32)
    idx = rng.integers(0, 300, size=(128, 1)).astype(np.int32)
    idx[7, 0], idx[90, 0] = 301, 5000
    with rejects(IndexError, match=_oob_message(301, 300, 48)):
        nki.simulate_kernel(indirect.gather_rows, data, idx)


def test_indirect_gather_negative_index_raises(indirect, rng, sim_only, rejects):
    data = rng.standard_normal((300, 48)).astype(np.float32)
    idx = rng.integers(0, 300, size=(128, 1)).astype(np.int32)
    idx[3, 0] = -1          # HBM offsets are unsigned on the device: no wrap-around
    with rejects(IndexError, match="out of bounds"):
        nki.simulate_kernel(indirect.gather_rows, data, idx)


def test_dma_copy_gather_in_bounds(indirect, rng):
    data = rng.standard_normal((256, 64)).astype(np.float32)
    idx = rng.integers(0, 256, size=(128, 1)).astype(np.int32)
    out = nki.simulate_kernel(indirect.gather_rows_dma, data, idx, skip=False, fill=-3.0)
    np.testing.assert_array_equal(out, data[idx[:, 0]])


def test_dma_copy_gather_oob_error(indirect, rng, rejects):
    data = rng.standard_normal((256, 64)).astype(np.float32)
    idx = (3 * np.arange(128)).reshape(128, 1).astype(np.int32)   # rows >= 256 from p = 86
    with rejects(IndexError, match=_oob_message(258, 256, 64)):
        nki.simulate_kernel(indirect.gather_rows_dma, data, idx, skip=False, fill=-3.0)


def test_dma_copy_gather_oob_skip_keeps_destination(indirect, rng):
    data = rng.standard_normal((256, 64)).astype(np.float32)
    idx = (3 * np.arange(128)).reshape(128, 1).astype(np.int32)
    out = nki.simulate_kernel(indirect.gather_rows_dma, data, idx, skip=True, fill=-3.0)
    valid = idx[:, 0] < 256
    np.testing.assert_array_equal(out[valid], data[idx[valid, 0]])
    np.testing.assert_array_equal(out[~valid], np.full((int((~valid).sum()), 64), -3.0, np.float32))


# --------------------------------------------------------------------------- scatter
def test_indirect_scatter_nl_store(indirect, rng):
    src = rng.standard_normal((128, 40)).astype(np.float32)
    idx = rng.permutation(384)[:128].reshape(128, 1).astype(np.int32)
    out = nki.simulate_kernel(indirect.scatter_rows, src, idx, nrows=384)
    ref = np.zeros((384, 40), np.float32)
    ref[idx[:, 0]] = src
    np.testing.assert_array_equal(out, ref)


def test_indirect_scatter_out_of_bounds_raises(indirect, rng, rejects):
    src = rng.standard_normal((128, 40)).astype(np.float32)
    idx = rng.permutation(384)[:128].reshape(128, 1).astype(np.int32)
    idx[11, 0] = 384
    with rejects(IndexError, match=_oob_message(384, 384, 40)):
        nki.simulate_kernel(indirect.scatter_rows, src, idx, nrows=384)


def test_dma_copy_scatter_add_accumulates_duplicates(indirect, rng):
    base = rng.standard_normal((64, 32)).astype(np.float32)
    src = rng.standard_normal((128, 32)).astype(np.float32)
    idx = rng.integers(0, 64, size=(128, 1)).astype(np.int32)    # duplicates on purpose
    ref = base.astype(np.float64)
    np.add.at(ref, idx[:, 0], src.astype(np.float64))
    caller_base = base.copy()
    out = nki.simulate_kernel(indirect.scatter_add_dma, caller_base, src, idx)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(caller_base, ref, rtol=1e-6, atol=1e-5)   # written in place


def test_dma_copy_scatter_skip_drops_out_of_bounds_rows(indirect, rng):
    base = rng.standard_normal((200, 16)).astype(np.float32)
    src = rng.standard_normal((128, 16)).astype(np.float32)
    idx = rng.permutation(400)[:128].reshape(128, 1).astype(np.int32)  # about half OOB
    ref = base.copy()
    ok = idx[:, 0] < 200
    assert ok.any() and (~ok).any()
    ref[idx[ok, 0]] = src[ok]
    out = nki.simulate_kernel(indirect.scatter_rows_dma_skip, base, src, idx)
    np.testing.assert_array_equal(out, ref)


# --------------------------------------------------------------------------- masks
@pytest.mark.parametrize("fill", [0.0, 7.5])
def test_masked_load_keeps_rest_of_destination(indirect, rng, fill):
    x = rng.standard_normal((100, 24)).astype(np.float32)
    out = nki.simulate_kernel(indirect.masked_load, x, fill=fill)
    np.testing.assert_array_equal(out[:100], x)
    np.testing.assert_array_equal(out[100:], np.full((28, 24), fill, np.float32))


def test_masked_tiled_load_int32_pads_with_zeros(indirect, rng):
    x = rng.integers(-(2**31), 2**31 - 1, size=(300, 5), dtype=np.int64).astype(np.int32)
    out = nki.simulate_kernel(indirect.masked_tiled_load, x)
    assert out.shape == (384, 5) and out.dtype == np.int32
    np.testing.assert_array_equal(out[:300], x)          # int32 bits preserved by DMA
    np.testing.assert_array_equal(out[300:], 0)


def test_masked_store_writes_only_the_corner_in_place(indirect, rng):
    x = rng.standard_normal((128, 64)).astype(np.float32)
    dst = rng.standard_normal((128, 64)).astype(np.float32)
    ref = dst.copy()
    ref[:50, :20] = 2 * x[:50, :20]
    out = nki.simulate_kernel(indirect.masked_store, x, dst, rows=50, cols=20)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(dst, ref)


# --------------------------------------------------------------------------- must-fail twins
@nki.jit
def _load_past_end_unmasked(x):
    out = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    tile = nl.zeros((128, x.shape[1]), dtype=x.dtype)
    tile[i_p, i_f] = nl.load(x[i_p, i_f])          # x has only 100 rows and no mask
    nl.store(out, value=tile)
    return out


def test_unmasked_load_past_the_end_is_a_static_oob_error(rng, rejects):
    x = rng.standard_normal((100, 24)).astype(np.float32)
    with rejects(Exception, match=r"(?i)out.of.bound"):
        nki.simulate_kernel(_load_past_end_unmasked, x)


@nki.jit
def _indirect_index_on_free_axis(data, idx):
    out = nl.ndarray((16, 128), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(16)[:, None]
    idx_tile = nl.load(idx)                             # (1, 128) int32
    cols = nl.load(data[i_p, idx_tile[0, nl.arange(128)[None, :]]])
    nl.store(out, value=cols)
    return out


def test_indirect_index_on_free_axis_is_rejected(rng, rejects):
    data = rng.standard_normal((16, 300)).astype(np.float32)
    idx = rng.integers(0, 300, size=(1, 128)).astype(np.int32)
    with rejects(Exception, match=r"(?i)indirect|partition"):
        nki.simulate_kernel(_indirect_index_on_free_axis, data, idx)


@nki.jit
def _indirect_index_from_hbm(data, idx):
    out = nl.ndarray((128, data.shape[1]), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(data.shape[1])[None, :]
    nl.store(out, value=nl.load(data[idx[i_p, 0], i_f]))   # index tensor still in HBM
    return out


def test_indirect_index_must_be_in_sbuf(rng, rejects):
    data = rng.standard_normal((300, 8)).astype(np.float32)
    idx = rng.integers(0, 300, size=(128, 1)).astype(np.int32)
    with rejects(Exception, match=r"(?i)sbuf|hbm|indirect"):
        nki.simulate_kernel(_indirect_index_from_hbm, data, idx)


def test_oob_mode_enum_is_exposed():
    assert nisa.oob_mode.error != nisa.oob_mode.skip
