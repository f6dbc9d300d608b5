"""host/variants.py: normalization, every validation error, and the BLOOM ALiBi slopes."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from host.variants import AttentionVariants, alibi_slopes, make_variants

E4M3FN = ml_dtypes.float8_e4m3fn


# ----------------------------------------------------------------------------- ALiBi slopes


@pytest.mark.parametrize("num_heads,expected", [
    (1, [2.0 ** -8]),
    (4, [0.25, 0.0625, 0.015625, 0.00390625]),
    (6, [0.25, 0.0625, 0.015625, 0.00390625,          # n = 4: 2^(-2i)
         0.5, 0.125]),                                 # extra: 2^(-j) for j = 1, 3
    (8, [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]),
    (12, [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
          0.7071067811865476, 0.3535533905932738, 0.1767766952966369, 0.08838834764831845]),
    (16, [0.7071067811865476, 0.5, 0.3535533905932738, 0.25, 0.1767766952966369, 0.125,
          0.08838834764831845, 0.0625, 0.04419417382415922, 0.03125, 0.02209708691207961,
          0.015625, 0.011048543456039806, 0.0078125, 0.005524271728019903, 0.00390625]),
])
def test_alibi_slopes_hand_computed(num_heads, expected):
    got = alibi_slopes(num_heads)
    assert got.dtype == np.float32 and got.shape == (num_heads,)
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.float32))


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_alibi_slopes_rejects_bad_head_counts(bad):
    with pytest.raises(ValueError, match="num_heads must"):
        alibi_slopes(bad)


# ----------------------------------------------------------------------------- normalization


def test_defaults_are_off():
    v = make_variants(8, 2, np.float32)
    assert v.is_default and not v.is_fp8
    assert (v.sliding_window, v.logits_soft_cap, v.alibi_slopes, v.sinks, v.k_scale, v.v_scale) == (None,) * 6
    assert v.kv_cache_dtype == np.dtype(np.float32) and v.kernel_cache_dtype == np.dtype(np.float32)


def test_normalization_dtypes_shapes_and_read_only():
    slopes = [0.5, 0.25, 0.125, 0.0625]
    v = make_variants(np.int64(4), 2, "bfloat16", sliding_window=np.int32(7), logits_soft_cap=30,
                      alibi_slopes=slopes, sinks=np.arange(4, dtype=np.float64))
    assert v.sliding_window == 7 and type(v.sliding_window) is int
    assert v.logits_soft_cap == 30.0 and type(v.logits_soft_cap) is float
    assert v.num_heads == 4 and type(v.num_heads) is int
    for arr, want in ((v.alibi_slopes, slopes), (v.sinks, [0, 1, 2, 3])):
        assert arr.dtype == np.float32 and arr.shape == (4,) and not arr.flags.writeable
        np.testing.assert_array_equal(arr, np.asarray(want, np.float32))
    assert v.kv_cache_dtype == np.dtype(ml_dtypes.bfloat16)
    assert not v.is_default


@pytest.mark.parametrize("scale", [0.5, np.float32(0.5), np.array(0.5), np.array([0.5]), [0.5, 0.5, 0.5]],
                         ids=["float", "np_scalar", "0d", "1_element", "per_head"])
def test_fp8_scales_become_per_kv_head_float32(scale):
    v = make_variants(6, 3, E4M3FN, k_scale=scale, v_scale=2)
    assert v.is_fp8 and not v.is_default
    assert v.kernel_cache_dtype == np.dtype(ml_dtypes.float8_e4m3)
    for arr, want in ((v.k_scale, 0.5), (v.v_scale, 2.0)):
        assert arr.dtype == np.float32 and arr.shape == (3,) and not arr.flags.writeable
        np.testing.assert_array_equal(arr, np.full(3, want, np.float32))


def test_caller_arrays_are_copied_not_frozen():
    sinks = np.zeros(2, np.float32)
    v = make_variants(2, 1, np.float32, sinks=sinks)
    sinks[0] = 5.0                                   # the caller's array stays writeable and separate
    assert v.sinks[0] == 0.0 and sinks.flags.writeable


def test_torch_inputs_accepted():
    torch = pytest.importorskip("torch")
    v = make_variants(2, 2, torch.float8_e5m2, alibi_slopes=torch.tensor([0.5, 0.25]),
                      k_scale=torch.tensor(2.0), v_scale=torch.tensor([1.0, 3.0]))
    assert v.kv_cache_dtype == np.dtype(ml_dtypes.float8_e5m2)
    np.testing.assert_array_equal(v.alibi_slopes, np.array([0.5, 0.25], np.float32))
    np.testing.assert_array_equal(v.v_scale, np.array([1.0, 3.0], np.float32))


def test_equality_and_hash_follow_the_values():
    a = make_variants(4, 2, np.float16, sinks=[1.0, 2.0, 3.0, 4.0], sliding_window=3)
    b = make_variants(4, 2, "float16", sinks=np.array([1, 2, 3, 4], np.float32), sliding_window=3)
    c = make_variants(4, 2, np.float16, sinks=[1.0, 2.0, 3.0, 5.0], sliding_window=3)
    assert a == b and hash(a) == hash(b)
    assert a != c and a != make_variants(4, 2, np.float16, sliding_window=3)
    with pytest.raises(AttributeError):
        a.sliding_window = 4                         # frozen


def test_direct_construction_validates_too():
    with pytest.raises(ValueError, match="sliding_window must be >= 1; got 0"):
        AttentionVariants(4, 2, np.float32, sliding_window=0)


# ----------------------------------------------------------------------------- must-fail


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_heads=0), r"num_heads must be >= 1; got 0"),
    (dict(num_kv_heads=0), r"num_kv_heads must be >= 1; got 0"),
    (dict(num_heads=6, num_kv_heads=4), r"num_heads must be divisible by num_kv_heads = 4; got 6"),
    (dict(num_heads=4.0), r"num_heads must be an integer; got 4.0"),
    (dict(kv_cache_dtype=np.int32), r"kv_cache_dtype must be a floating dtype; got dtype int32"),
    (dict(kv_cache_dtype="no-such-type"), r"kv_cache_dtype must be a floating dtype; got 'no-such-type'"),
    (dict(sliding_window=0), r"sliding_window must be >= 1; got 0"),
    (dict(sliding_window=-5), r"sliding_window must be >= 1; got -5"),
    (dict(sliding_window=4.0), r"sliding_window must be an integer; got 4.0"),
    (dict(sliding_window=True), r"sliding_window must be an integer; got True"),
    (dict(logits_soft_cap=0.0), r"logits_soft_cap must be a finite number > 0 or None; got 0.0"),
    (dict(logits_soft_cap=-30.0), r"logits_soft_cap must be a finite number > 0 or None; got -30.0"),
    (dict(logits_soft_cap=math.inf), r"logits_soft_cap must be a finite number > 0 or None; got inf"),
    (dict(logits_soft_cap=math.nan), r"logits_soft_cap must be a finite number > 0 or None; got nan"),
    (dict(logits_soft_cap="30"), r"logits_soft_cap must be a real number or None; got '30'"),
    (dict(logits_soft_cap=True), r"logits_soft_cap must be a real number or None; got True"),
    (dict(alibi_slopes=[0.5, 0.25]), r"alibi_slopes must have shape \(num_heads,\) = \(4,\); got shape \(2,\)"),
    (dict(alibi_slopes=np.ones((4, 1))), r"alibi_slopes must have shape \(num_heads,\) = \(4,\); got shape \(4, 1\)"),
    (dict(alibi_slopes=[0.5, np.nan, 0.1, 0.1]), r"alibi_slopes must hold finite values.*nan"),
    (dict(alibi_slopes=[0.5, 1e39, 0.1, 0.1]), r"alibi_slopes must hold finite values \(in float32\)"),
    (dict(alibi_slopes=np.array(["a"] * 4)), r"alibi_slopes must be a real \(float\) array; got dtype <U1"),
    (dict(sinks=[1.0, 2.0, 3.0]), r"sinks must have shape \(num_heads,\) = \(4,\); got shape \(3,\)"),
    (dict(sinks=[1.0, -np.inf, 3.0, 4.0]), r"sinks must hold finite values.*-inf"),
    (dict(k_scale=1.0), r"k_scale must be None for a float32 KV cache \(scales apply to float8"),
    (dict(v_scale=np.ones(2)), r"v_scale must be None for a float32 KV cache.*shape=\(2,\)"),
    (dict(kv_cache_dtype=E4M3FN), r"k_scale must be given for a float8_e4m3fn KV cache.*; got None"),
    (dict(kv_cache_dtype=E4M3FN, k_scale=1.0), r"v_scale must be given for a float8_e4m3fn KV cache"),
    (dict(kv_cache_dtype=E4M3FN, k_scale=0.0, v_scale=1.0), r"k_scale must hold finite values > 0.*0.0"),
    (dict(kv_cache_dtype=E4M3FN, k_scale=-2.0, v_scale=1.0), r"k_scale must hold finite values > 0.*-2.0"),
    (dict(kv_cache_dtype=E4M3FN, k_scale=1.0, v_scale=np.inf), r"v_scale must hold finite values > 0.*inf"),
    (dict(kv_cache_dtype=E4M3FN, k_scale=1.0, v_scale=1e-45), r"v_scale must hold values whose float32 reciprocal is finite"),
    (dict(kv_cache_dtype=E4M3FN, k_scale=[1.0, 2.0, 3.0], v_scale=1.0),
     r"k_scale must be a float, a 1-element array or have shape \(num_kv_heads,\) = \(2,\); got shape \(3,\)"),
    (dict(kv_cache_dtype=E4M3FN, k_scale=True, v_scale=1.0), r"k_scale must be a positive finite float.*; got True"),
    (dict(kv_cache_dtype=E4M3FN, k_scale="1", v_scale=1.0), r"k_scale must be a real number or a real array; got dtype <U1"),
])
def test_bad_options_raise_value_error_naming_argument_and_value(kwargs, match):
    args = dict(num_heads=4, num_kv_heads=2, kv_cache_dtype=np.float32)
    args.update(kwargs)
    h, hkv, dt = args.pop("num_heads"), args.pop("num_kv_heads"), args.pop("kv_cache_dtype")
    with pytest.raises(ValueError, match=match):
        make_variants(h, hkv, dt, **args)


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz])
def test_other_fp8_flavours_are_not_implemented(dtype):
    with pytest.raises(NotImplementedError, match="float8_e4m3fn or float8_e5m2"):
        make_variants(2, 1, dtype, k_scale=1.0, v_scale=1.0)
