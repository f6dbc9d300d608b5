"""host/fp8.py: the e4m3fn <-> IEEE-style e4m3 byte correspondence (exhaustive), the kernel view,
the saturation bounds and the per-row inverse scales of the cache write."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from host.cache.cache_ops import cache_write_row_index
from host.fp8 import (SATURATION, as_cache_dtype, cache_write_row_scales, kernel_cache_dtype,
                      kernel_cache_view)

E4M3FN, E4M3, E5M2 = (np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3,
                                             ml_dtypes.float8_e5m2))
ALL_BYTES = np.arange(256, dtype=np.uint8)


def test_every_byte_pattern_with_magnitude_at_most_240_means_the_same_in_both_formats():
    fn = ALL_BYTES.view(E4M3FN).astype(np.float64)
    ieee = ALL_BYTES.view(E4M3).astype(np.float64)
    same = (fn == ieee) | (np.isnan(fn) & np.isnan(ieee))
    differ = ALL_BYTES[~same]
    # exactly the 14 patterns with exponent 1111 and mantissa 000..110 (both signs) differ
    assert differ.tolist() == [0x78, 0x79, 0x7A, 0x7B, 0x7C, 0x7D, 0x7E,
                               0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE]
    assert np.all(np.abs(fn[~same]) >= 256) and np.all(np.abs(fn[~same]) <= 448)
    assert np.all(~np.isfinite(ieee[~same]))                       # inf / NaN in IEEE-style e4m3
    # every finite e4m3fn value with |x| <= 240 has the same pattern in both formats
    small = np.isfinite(fn) & (np.abs(fn) <= 240)
    assert small.sum() == 256 - 14 - 2                               # all but the 14 and the 2 NaNs
    assert np.all(same[small])
    assert np.isnan(fn[0x7F]) and np.isnan(fn[0xFF]) and np.isnan(ieee[0x7F]) and np.isnan(ieee[0xFF])


def test_rounding_into_both_formats_agrees_on_the_saturated_range():
    """RNE of any float32 in [-240, 240] gives the same byte in e4m3fn and in IEEE-style e4m3:
    every representable value, every midpoint (the ties) and random values."""
    rng = np.random.default_rng(3)
    reps = ALL_BYTES.view(E4M3FN).astype(np.float32)
    reps = np.sort(reps[np.isfinite(reps) & (np.abs(reps) <= 240)])
    mids = (reps[:-1] + reps[1:]) / 2
    nudged = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    x = np.concatenate([reps, mids, nudged, rng.uniform(-240, 240, 20000).astype(np.float32),
                        rng.uniform(-1e-2, 1e-2, 5000).astype(np.float32)])  # subnormal range too
    assert np.all(np.abs(x) <= 240)
    np.testing.assert_array_equal(x.astype(E4M3FN).view(np.uint8), x.astype(E4M3).view(np.uint8))


def test_saturation_bounds():
    assert SATURATION[E4M3FN] == float(ml_dtypes.finfo(E4M3).max) == 240.0   # not e4m3fn's 448
    assert SATURATION[E5M2] == float(ml_dtypes.finfo(E5M2).max) == 57344.0
    # why saturate: an unsaturated cast overflows to NaN (e4m3fn) / inf (e4m3)
    big = np.array([300.0, 1e6], np.float32)
    assert np.isnan(big[1:].astype(E4M3FN).astype(np.float32)).all()
    assert np.isinf(np.array([250.0], np.float32).astype(E4M3).astype(np.float32)).all()


def test_kernel_view_is_zero_copy_and_writes_through():
    cache = ALL_BYTES.view(E4M3FN).reshape(2, 2, 2, 4, 8).copy()
    view = kernel_cache_view(cache)
    assert view.dtype == E4M3 and np.shares_memory(view, cache) and view.shape == cache.shape
    assert view.view(E4M3FN).tobytes() == cache.tobytes()               # inverse: view back
    view[0, 0, 0, 0, 0] = np.float32(-3.5)                           # a shared pattern
    assert cache[0, 0, 0, 0, 0] == np.float32(-3.5).astype(E4M3FN)
    other = np.zeros((2, 1, 1, 1, 4), E5M2)
    assert kernel_cache_view(other) is other
    assert kernel_cache_dtype(E4M3FN) == E4M3 and kernel_cache_dtype(np.float32) == np.dtype(np.float32)


def test_as_cache_dtype_accepts_torch_dtypes_and_names():
    assert as_cache_dtype("x", "float8_e4m3fn") == E4M3FN
    assert as_cache_dtype("x", np.float16) == np.dtype(np.float16)
    torch = pytest.importorskip("torch")
    assert as_cache_dtype("x", torch.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    assert as_cache_dtype("x", torch.float8_e4m3fn) == E4M3FN
    with pytest.raises(ValueError, match="x must be a floating dtype; got dtype int8"):
        as_cache_dtype("x", torch.int8)


def test_row_scales_follow_the_row_index_order_and_invert():
    """Row q = t * Hkv + h of the scales belongs to the same (token, head) as row q of
    cache_write_row_index; inverting the first Hkv rows gives back the per-head scales."""
    k_scale = np.array([0.5, 3.0, 0.1], np.float32)
    v_scale = np.array([2.0, 0.25, 7.0], np.float32)
    slots = np.array([5, -1, 9, 0])
    rows = cache_write_row_scales(k_scale, v_scale, num_tokens=4)
    idx = cache_write_row_index(slots, num_blocks=4, num_kv_heads=3, block_size=4)
    assert rows.shape == (12, 2) and rows.dtype == np.float32 and rows.flags.c_contiguous
    for t in range(4):
        for h in range(3):
            q = t * 3 + h
            assert rows[q, 0] == np.float32(1) / k_scale[h] and rows[q, 1] == np.float32(1) / v_scale[h]
            if slots[t] >= 0:       # the index row q addresses head h of token t's slot
                assert idx[q, 0] == ((slots[t] // 4) * 3 + h) * 4 + slots[t] % 4
    np.testing.assert_allclose(1 / rows[:3, 0], k_scale, rtol=1e-7)
    np.testing.assert_allclose(1 / rows[:3, 1], v_scale, rtol=1e-7)
