"""Low-precision numerics (Vector math in fp32, one rounding on write), extra ops
(nl.softmax, nisa.tensor_tensor_scan), scratch HBM buffers and bool inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation
BF16 = ml_dtypes.bfloat16


def _bf16_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(BF16).view(np.uint16)


@nki.jit
def bf16_reductions_k(x):
    """x (P, F) bf16 -> (nl.sum, nl.max, nisa.tensor_reduce add) over the free axis, each
    returned in the input dtype (bf16, the default output dtype)."""
    o_sum = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
    o_max = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
    o_tr = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    s = nl.sum(tile, axis=1, keepdims=True)
    assert s.dtype == np.dtype(BF16), s.dtype
    nl.store(o_sum, value=s)
    nl.store(o_max, value=nl.max(tile, axis=1, keepdims=True))
    nl.store(o_tr, value=nisa.tensor_reduce(np.add, tile, axis=(1,), keepdims=True))
    return o_sum, o_max, o_tr


def test_bf16_reductions_accumulate_in_fp32_and_round_once(rng):
    # 1 + 511 values of 2**-9: a bf16 running sum would stall at 1.0 (2**-9 is below half an
    # ulp of 1.0 in bf16); an fp32 accumulation gives 1 + 511 * 2**-9 ~= 1.998 -> bf16 2.0
    x = np.full((128, 512), 2.0**-9, np.float32)
    x[:, 0] = 1.0
    x[1::2] *= rng.uniform(0.5, 1.5, size=(64, 512)).astype(np.float32)
    xb = x.astype(BF16)
    o_sum, o_max, o_tr = nki.simulate_kernel(bf16_reductions_k, xb)
    fp32_sum = xb.astype(np.float32).sum(axis=1, keepdims=True, dtype=np.float64).astype(np.float32)
    for got in (o_sum, o_tr):
        np.testing.assert_array_equal(got.view(np.uint16), _bf16_bits(fp32_sum))
    np.testing.assert_array_equal(o_max.view(np.uint16), xb.max(axis=1, keepdims=True).view(np.uint16))


@nki.jit
def bf16_chain_k(a, b):
    """exp(a) * b with bf16 tiles: each op computes in fp32 and rounds its own output to bf16."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    e = nl.exp(nl.load(a))
    assert e.dtype == np.dtype(BF16), e.dtype
    nl.store(out, value=nl.multiply(e, nl.load(b)))
    return out


def test_bf16_op_chain_rounds_after_every_op(rng):
    a = rng.uniform(-2, 2, size=(64, 64)).astype(BF16)
    b = rng.uniform(-2, 2, size=(64, 64)).astype(BF16)
    out = nki.simulate_kernel(bf16_chain_k, a, b)
    e = np.exp(a.astype(np.float64)).astype(np.float32).astype(BF16)     # rounded once
    ref = (e.astype(np.float32) * b.astype(np.float32)).astype(BF16)
    # exp may differ from NumPy's by 1 fp32 ulp, which can flip a bf16 tie: allow 1 bf16 ulp
    diff = np.abs(out.view(np.uint16).astype(np.int32) - ref.view(np.uint16).astype(np.int32))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99


@nki.jit
def softmax_k(x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.softmax(nl.load(x), axis=1))
    return out


def test_nl_softmax(rng):
    x = (rng.standard_normal((128, 100)) * 3).astype(np.float32)
    out = nki.simulate_kernel(softmax_k, x)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


@nki.jit
def scan_k(d0, d1, init):
    out = nl.ndarray(d0.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    res = nisa.tensor_tensor_scan(nl.load(d0), nl.load(d1), nl.load(init), np.multiply, np.add)
    nl.store(out, value=res)
    return out


def test_tensor_tensor_scan_linear_recurrence(rng):
    d0 = rng.uniform(0.5, 1.0, size=(64, 20)).astype(np.float32)
    d1 = rng.standard_normal((64, 20)).astype(np.float32)
    init = rng.standard_normal((64, 1)).astype(np.float32)
    out = nki.simulate_kernel(scan_k, d0, d1, init)
    ref = np.empty((64, 20))
    prev = init[:, 0].astype(np.float64)
    for i in range(20):                       # r_i = d0_i * r_{i-1} + d1_i
        prev = d0[:, i] * prev + d1[:, i]
        ref[:, i] = prev
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@nki.jit
def hbm_scratch_k(x, *, buffer_name):
    """Round trip through a kernel-local HBM scratch tensor (nl.hbm / nl.private_hbm)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    scratch = nl.ndarray(x.shape, dtype=x.dtype, buffer=getattr(nl, buffer_name))
    nl.store(scratch, value=nl.multiply(nl.load(x), 3.0))
    nl.store(out, value=nl.load(scratch))
    return out


@pytest.mark.parametrize("buffer_name", ["hbm", "private_hbm", "shared_hbm"])
def test_hbm_scratch_buffers(rng, buffer_name):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    out = nki.simulate_kernel(hbm_scratch_k, x, buffer_name=buffer_name)
    np.testing.assert_allclose(out, 3 * x.astype(np.float64), rtol=1e-6)


@nki.jit
def bool_mask_where_k(mask, x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    m = nl.load(mask)
    nl.device_print("mask tile", m)
    nl.store(out, value=nl.where(m, nl.load(x), -9984.0, dtype=nl.float32))
    return out


def test_bool_mask_input_selects(rng):
    mask = rng.integers(0, 2, size=(64, 32)).astype(np.bool_)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    out = nki.simulate_kernel(bool_mask_where_k, mask, x)
    np.testing.assert_array_equal(out, np.where(mask, x, np.float32(-9984.0)))


@nki.jit
def low_precision_writes_k(x):
    """(iota 0..511 as bf16, memset 1/3 as bf16, fp32 x -> uint8 copy, int32 iota -> bf16 copy)."""
    o_iota = nl.ndarray((1, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_memset = nl.ndarray((4, 8), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_u8 = nl.ndarray(x.shape, dtype=nl.uint8, buffer=nl.shared_hbm)
    o_i2b = nl.ndarray((1, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    nl.store(o_iota, value=nisa.iota(nl.arange(512)[None, :], dtype=nl.bfloat16))
    nl.store(o_memset, value=nisa.memset(shape=(4, 8), value=1.0 / 3.0, dtype=nl.bfloat16))
    nl.store(o_u8, value=nl.copy(nl.load(x), dtype=nl.uint8))
    ints = nisa.iota(nl.arange(512)[None, :] * 4099, dtype=nl.int32)
    nl.store(o_i2b, value=nl.copy(ints, dtype=nl.bfloat16))
    return o_iota, o_memset, o_u8, o_i2b


def test_low_precision_writes_round_to_nearest_even_and_saturate():
    x = np.array([[-5.0, -0.5, 0.5, 1.5, 2.5, 254.5, 255.5, 300.0]], np.float32)
    o_iota, o_memset, o_u8, o_i2b = nki.simulate_kernel(low_precision_writes_k, x)
    np.testing.assert_array_equal(o_iota.view(np.uint16), _bf16_bits(np.arange(512)[None, :]))
    np.testing.assert_array_equal(o_memset.view(np.uint16), _bf16_bits(np.full((4, 8), 1 / 3)))
    np.testing.assert_array_equal(o_u8, np.clip(np.rint(x), 0, 255).astype(np.uint8))
    big = (np.arange(512) * 4099)[None, :].astype(np.float64)          # exact in float64
    np.testing.assert_array_equal(o_i2b.view(np.uint16), big.astype(BF16).view(np.uint16))


@nki.jit
def immediates_k(x, *, value):
    """bf16 writes of a Python-float immediate: nisa.memset, nl.full, scalar assignment and a
    multiply by the immediate; each returned as a bf16 (1, 8) row."""
    o_memset = nl.ndarray((1, 8), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_full = nl.ndarray((1, 8), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_assign = nl.ndarray((1, 8), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_mul = nl.ndarray((1, 8), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    nl.store(o_memset, value=nisa.memset(shape=(1, 8), value=value, dtype=nl.bfloat16))
    nl.store(o_full, value=nl.full((1, 8), value, dtype=nl.bfloat16))
    t = nl.ndarray((1, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
    t[...] = value
    nl.store(o_assign, value=t)
    nl.store(o_mul, value=nl.multiply(nl.load(x), value, dtype=nl.bfloat16))
    return o_memset, o_full, o_assign, o_mul


def test_python_float_immediates_are_fp32_before_rounding_to_bf16():
    # 1 + 2**-8 + 2**-30: as a float64 it lies just above the bf16 midpoint 1 + 2**-8 and
    # would round up; as the fp32 immediate the hardware sees it is exactly the midpoint
    # (2**-30 is below half an fp32 ulp) and rounds to even, i.e. to 1.0
    value = 1.0 + 2.0**-8 + 2.0**-30
    assert np.float32(value) == np.float32(1.0 + 2.0**-8)
    outs = nki.simulate_kernel(immediates_k, np.ones((1, 8), np.float32), value=value)
    expected = _bf16_bits(np.full((1, 8), np.float32(value)))
    assert expected[0, 0] == 0x3F80
    for name, got in zip(["memset", "full", "assign", "multiply"], outs):
        np.testing.assert_array_equal(got.view(np.uint16), expected, err_msg=name)


@nki.jit
def int_to_bf16_k(x):
    """int32 (P, F) -> bf16 three ways: DMA store of the int tile into a bf16 HBM tensor,
    nisa.dma_copy into a bf16 HBM tensor, and nl.copy(dtype=bf16)."""
    o_store = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_dma = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_copy = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    tile = nl.load(x)
    nl.store(o_store, value=tile)
    nisa.dma_copy(dst=o_dma, src=tile)
    nl.store(o_copy, value=nl.copy(tile, dtype=nl.bfloat16))
    return o_store, o_dma, o_copy


def test_int_to_bf16_goes_through_fp32():
    # DMA casts "first from src.dtype to float32, then from float32 to dst.dtype"; Vector math
    # is fp32 too. 2**24 + 2**16 + 1 rounds (ties-to-even) to 2**24 + 2**16 in fp32, a bf16
    # tie that rounds to even = 2**24; a direct int -> bf16 rounding would give 2**24 + 2**17.
    x = np.array([[2**24 + 2**16 + 1, 3, -(2**24 + 2**16 + 1), 2**30 + 2**22 + 1]], np.int32)
    via_fp32 = x.astype(np.float32).astype(BF16)
    v = int(x[0, 0])                          # the nearest bf16 to v itself is 2**24 + 2**17
    assert via_fp32[0, 0] == 2.0**24 and abs(v - 2**24) > abs(v - (2**24 + 2**17))
    for name, got in zip(["store", "dma_copy", "copy"], nki.simulate_kernel(int_to_bf16_k, x)):
        np.testing.assert_array_equal(got.view(np.uint16), via_fp32.view(np.uint16), err_msg=name)
