"""Write casts (RNE, saturation), NKI type promotion, poison values, storage dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_sim import dtypes as D

from test_core_helpers import f32, nl, run


@pytest.mark.parametrize("a,b,expected", [
    (D.int8, D.uint8, D.int16), (D.int8, D.uint16, D.int32), (D.uint16, D.int32, D.int32),
    (D.int32, D.uint32, D.float32), (D.float16, D.bfloat16, D.float32),
    (D.float8_e4m3, D.float16, D.float16), (D.float8_e4m3, D.bfloat16, D.bfloat16),
    (D.float8_e4m3, D.float8_e5m2, D.bfloat16), (D.float32, D.int32, D.float32),
    (D.bfloat16, D.int8, D.bfloat16), (D.int32, D.int32, D.int32),
])
def test_promotion_table(a, b, expected):
    assert D.promote(a, b) == expected
    assert D.promote(b, a) == expected


def test_python_scalars_are_int32_float32_uint8():
    assert D.scalar_dtype(3) == D.int32
    assert D.scalar_dtype(0.5) == D.float32
    assert D.scalar_dtype(True) == D.uint8
    assert D.promote(D.bfloat16, D.scalar_dtype(0.125)) == D.float32     # bf16 * 0.125 -> fp32
    assert D.promote(D.int8, D.scalar_dtype(2)) == D.int32


def test_float_to_int_rounds_half_to_even_and_saturates():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3e9, -3e9, np.nan, np.inf], np.float32)
    out = D.cast_for_write(v, D.int32)
    assert out.tolist() == [0, 2, 2, 0, -2, 2**31 - 1, -2**31, 0, 2**31 - 1]
    assert D.cast_for_write(np.array([300, -300]), D.int8).tolist() == [127, -128]
    assert D.cast_for_write(np.array([-1, 70000]), D.uint16).tolist() == [0, 65535]


def test_float_to_bf16_is_round_to_nearest_even():
    # 1 + 2^-8 is exactly halfway between bf16 neighbours 1.0 and 1 + 2^-7 -> ties to even (1.0)
    halfway = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8], np.float32)
    out = D.cast_for_write(halfway, D.bfloat16).astype(np.float64)
    assert out.tolist() == [1.0, 1.0 + 2 * 2.0**-7]
    # not the truncation a naive bit-shift would give
    assert D.cast_for_write(np.array([1.0 + 2.0**-8 + 2.0**-20], np.float32), D.bfloat16
                            ).astype(np.float64)[0] == 1.0 + 2.0**-7


def test_poison_values():
    assert np.isnan(D.poison_value(D.bfloat16))
    assert D.poison_value(D.int32) == 2**31 - 1
    assert D.poison_value(D.uint8) == 255


def test_as_dtype_rejects_float64():
    with pytest.raises(ValueError, match="float64"):
        D.as_dtype(np.float64)


def _store_cast(x, *, dtype):
    out = nl.ndarray(x.shape, dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out, t)
    return out


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3, np.int32])
def test_store_casts_to_destination_dtype(rng, dtype):
    x = (rng.standard_normal((4, 16)) * 10).astype(np.float32)
    out = run(_store_cast, x, dtype=dtype)
    assert out.dtype == np.dtype(dtype)
    expect = np.rint(x).astype(np.int32) if dtype == np.int32 else x.astype(dtype)
    assert np.array_equal(out.astype(np.float64), expect.astype(np.float64))


def _tile_dtype(x):
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x, dtype=nl.bfloat16)
    assert t.dtype == np.dtype(ml_dtypes.bfloat16)
    y = t * 0.5                     # bf16 tile * python float -> fp32 (NKI promotion)
    assert y.dtype == np.dtype(np.float32)
    z = nl.multiply(t, t)
    assert z.dtype == t.dtype
    nl.store(out, y)
    return out


def test_tiles_are_stored_in_declared_dtype(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    out = run(_tile_dtype, x)
    assert np.array_equal(out, x.astype(ml_dtypes.bfloat16).astype(np.float32) * 0.5)


def _int_math(a, b):
    out = nl.ndarray(a.shape, nl.int32, buffer=nl.shared_hbm)
    ta, tb = nl.load(a), nl.load(b)
    nl.store(out, ta * 3 + tb)
    return out


def test_int32_arithmetic_is_exact_above_2_24(rng):
    a = rng.integers(2**24, 2**28, (16, 4)).astype(np.int32)
    b = rng.integers(-1000, 1000, (16, 4)).astype(np.int32)
    out = run(_int_math, a, b)
    assert np.array_equal(out, a.astype(np.int64) * 3 + b)


def test_int32_arithmetic_saturates_on_write():
    a = np.full((2, 2), 2**30, np.int32)
    b = np.zeros((2, 2), np.int32)
    out = run(_int_math, a, b)
    assert np.all(out == 2**31 - 1)


def _int_transpose(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), nl.int32, buffer=nl.shared_hbm)
    nl.store(out, nl.transpose(nl.load(x)))
    return out


def test_int_transpose_is_exact_and_warns_above_2_24():
    small = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert np.array_equal(run(_int_transpose, small), small.T)
    big = small + 2**24
    with pytest.warns(RuntimeWarning, match="2\\^24"):
        assert np.array_equal(run(_int_transpose, big), big.T)


def _rne_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Independent float32 -> bfloat16 round-to-nearest-even on the bit pattern (finite inputs)."""
    bits = x.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    return ((bits + 0x7FFF + lsb) >> 16).astype(np.uint16)


def test_bf16_cast_matches_bitwise_rne_reference():
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) < 3.3e38)]
    got = D.cast_for_write(x, D.bfloat16).view(np.uint16)
    assert np.array_equal(got, _rne_bf16_bits(x))


_DTS = [np.float32, ml_dtypes.bfloat16, np.float16, np.int32, np.int8, np.uint8]


def _binop(a, b, *, op):
    out_t = getattr(nl, op)(nl.load(a), nl.load(b))
    out = nl.ndarray(out_t.shape, out_t.dtype, buffer=nl.shared_hbm)
    nl.store(out, out_t)
    return out


def test_binary_ops_match_an_fp32_or_exact_int_reference():
    """Random dtype pairs: result dtype = NKI promotion; floats computed in fp32 then rounded to
    the output dtype; integer-only operands exact, saturated to the output range."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40, deadline=None)
    @given(da=st.sampled_from(_DTS), db=st.sampled_from(_DTS), op=st.sampled_from(["add", "multiply", "maximum", "subtract"]),
           seed=st.integers(0, 1000))
    def check(da, db, op, seed):
        r = np.random.default_rng(seed)
        def sample(d):
            d = np.dtype(d)
            if d.kind in "iu":
                info = np.iinfo(d)
                return r.integers(max(info.min, -100), min(info.max, 100), (4, 8)).astype(d)
            return (r.standard_normal((4, 8)) * 10).astype(d)
        a, b = sample(da), sample(db)
        out = run(_binop, a, b, op=op)
        expect_dt = D.promote(np.dtype(da), np.dtype(db))
        assert out.dtype == expect_dt
        f = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum, "subtract": np.subtract}[op]
        if np.dtype(da).kind in "iu" and np.dtype(db).kind in "iu":
            ref = f(a.astype(np.int64), b.astype(np.int64))
            if expect_dt.kind in "iu":
                info = np.iinfo(expect_dt)
                ref = np.clip(ref, info.min, info.max).astype(expect_dt)
            else:
                ref = ref.astype(np.float32).astype(expect_dt)
        else:
            ref = f(a.astype(np.float32), b.astype(np.float32)).astype(expect_dt)
        assert np.array_equal(out.astype(np.float64), ref.astype(np.float64))
    check()


def _add_shapes(a, b, *, a_col, b_col):
    ta, tb = nl.load(a), nl.load(b)
    if a_col:
        ta = ta[:, 0]                       # (P,) view of a (P, 1) tile
    if b_col:
        tb = tb[:, 0]
    r = nl.add(ta, tb)
    out = nl.ndarray(r.shape, r.dtype, buffer=nl.shared_hbm)
    nl.store(out, r)
    return out


@pytest.mark.parametrize("sa,sb,a_col,b_col,expect", [
    ((8, 5), (8, 1), False, False, (8, 5)),
    ((8, 5), (8, 1), False, True, (8, 5)),      # (P,) left-aligned against (P, F)
    ((8, 1), (8, 1), True, False, (8, 1)),
    ((1, 5), (8, 5), False, False, (8, 5)),     # partition broadcast through nl.add
    ((8, 1), (1, 5), False, False, (8, 5)),
])
def test_left_aligned_broadcasting(rng, sa, sb, a_col, b_col, expect):
    a, b = f32(rng, *sa), f32(rng, *sb)
    out = run(_add_shapes, a, b, a_col=a_col, b_col=b_col)
    assert out.shape == expect
    assert np.array_equal(out, (a + b).reshape(expect) if not (a_col or b_col)
                          else np.broadcast_to(a + b, expect))


@pytest.mark.parametrize("n", [16, 80000])
def test_bf16_widening_matches_ml_dtypes_bit_for_bit(rng, n):
    # every bf16 bit pattern class: random bits (NaNs, infinities, subnormals, both signs); the
    # large size takes the bit-shift path of as_f32, the small one NumPy's own cast
    bits = rng.integers(0, 2 ** 16, size=n, dtype=np.uint32).astype(np.uint16)
    bits[:6] = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x0001]
    x = bits.view(ml_dtypes.bfloat16).reshape(-1, 8)[:, ::2]      # a strided view too
    got = D.as_f32(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint32), x.astype(np.float32).view(np.uint32))
