"""host/validation.py and host/_arrays.py: each check passes good input and rejects bad input."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from host._arrays import from_numpy_like, is_torch_tensor, readonly, to_numpy
from host.validation import (check_float_array, check_index_range, check_int, check_integer_array,
                             check_lens, check_ndim, check_power_of_two, check_shape, is_float_dtype)


def test_check_int():
    assert check_int("x", np.int32(5), min_value=0, max_value=5) == 5
    for bad, frag in [(1.5, "be an integer; got 1.5"), (True, "be an integer; got True"),
                      ("3", "be an integer; got '3'")]:
        with pytest.raises(ValueError, match="^x must ") as ei:
            check_int("x", bad)
        assert frag in str(ei.value)
    with pytest.raises(ValueError, match="^x must be >= 1; got 0$"):
        check_int("x", 0, min_value=1)
    with pytest.raises(ValueError, match="^x must be <= 3; got 4$"):
        check_int("x", 4, max_value=3)


def test_check_power_of_two():
    assert check_power_of_two("b", 64, lo=1, hi=256) == 64
    for bad in (0, 3, 512, -4):
        with pytest.raises(ValueError, match=r"^b must be a power of two in \[1, 256\]"):
            check_power_of_two("b", bad, lo=1, hi=256)


def test_check_lens():
    np.testing.assert_array_equal(check_lens("q", [1, 2], min_value=1), [1, 2])
    with pytest.raises(ValueError, match=r"^q must be >= 1 everywhere; got q\[2\] = 0$"):
        check_lens("q", [1, 2, 0], min_value=1)
    with pytest.raises(ValueError, match="^q must have 3 entries"):
        check_lens("q", [1, 2], min_value=1, length=3)
    with pytest.raises(ValueError, match="^q must be 1-D"):
        check_lens("q", [[1]], min_value=1)


def test_check_arrays_and_shapes():
    assert check_integer_array("a", np.array([1], np.uint8)).dtype == np.int64
    with pytest.raises(ValueError, match="^a must have an integer dtype; got dtype float32"):
        check_integer_array("a", np.zeros(2, np.float32))
    assert check_float_array("f", np.zeros(2, ml_dtypes.bfloat16)).dtype.name == "bfloat16"
    with pytest.raises(ValueError, match="^f must have a floating dtype; got dtype int64"):
        check_float_array("f", np.zeros(2, np.int64))
    check_ndim("a", np.zeros((2, 3)), 2)
    with pytest.raises(ValueError, match=r"^a must be 3-D; got shape \(2, 3\)"):
        check_ndim("a", np.zeros((2, 3)), 3)
    check_shape("a", np.zeros((2, 3)), (2, None))
    with pytest.raises(ValueError, match=r"^a must have shape \(\*, 4\) \(rows, cols\); got shape \(2, 3\)"):
        check_shape("a", np.zeros((2, 3)), (None, 4), "(rows, cols)")
    check_index_range("i", np.array([[0, 4]]), upper=5, what="ids")
    with pytest.raises(ValueError, match=r"^i must hold ids in \[0, 5\); got i\[0, 1\] = 5"):
        check_index_range("i", np.array([[0, 5]]), upper=5, what="ids")


def test_is_float_dtype():
    assert is_float_dtype(np.float16) and is_float_dtype(ml_dtypes.bfloat16)
    assert not is_float_dtype(np.int32) and not is_float_dtype(np.bool_) and not is_float_dtype("V4")


def test_to_numpy_numpy_and_sequences():
    a = np.arange(3)
    out, was_torch = to_numpy(a, "a")
    assert out is a and not was_torch
    out, was_torch = to_numpy([1, 2], "a")
    assert out.tolist() == [1, 2] and not was_torch
    assert from_numpy_like(a, False) is a
    assert not is_torch_tensor(a) and not is_torch_tensor([1])
    with pytest.raises(ValueError, match="^a must be array-like"):
        to_numpy([[1, 2], [3]], "a")


def test_readonly():
    a = readonly(np.zeros(2))
    with pytest.raises(ValueError):
        a[0] = 1


def test_torch_round_trip_including_bfloat16():
    torch = pytest.importorskip("torch")
    t = torch.arange(4, dtype=torch.float32).to(torch.bfloat16)
    arr, was_torch = to_numpy(t, "t")
    assert was_torch and arr.dtype.name == "bfloat16" and arr.astype(np.float32).tolist() == [0, 1, 2, 3]
    back = from_numpy_like(arr, True, like=t)
    assert isinstance(back, torch.Tensor) and back.dtype == torch.bfloat16 and torch.equal(back, t)


# ----------------------------------------------------------------- integer inputs: true values, floats
@pytest.mark.parametrize("values, where, shown", [
    (np.array([3, 2**63 + 5], np.uint64), "x[1]", str(2**63 + 5)),
    (np.array([[1], [2**64 - 1]], np.uint64), "x[1, 0]", str(2**64 - 1)),
    ([2**63], "x[0]", str(2**63)),                        # NumPy makes this list uint64
])
def test_uint64_beyond_int64_is_shown_with_its_true_value(values, where, shown):
    with pytest.raises(ValueError, match=r"^x must hold values below 2\*\*63") as ei:
        check_integer_array("x", values)
    assert f"{where} = {shown} (dtype uint64)" in str(ei.value)
    assert "-" not in str(ei.value).split("got")[1]         # never wrapped to a negative int64


def test_python_ints_beyond_int64_are_rejected_with_their_value():
    for values, where in (([2**70, 1], f"x[0] = {2**70}"), ([1, -2**64], f"x[1] = {-2**64}")):
        with pytest.raises(ValueError, match=r"^x must hold values in the int64 range") as ei:
            check_lens("x", values, min_value=0)
        assert where in str(ei.value)


def test_uint_values_inside_int64_are_accepted():
    assert check_lens("x", np.array([5, 2**63 - 1], np.uint64), min_value=0).tolist() == [5, 2**63 - 1]
    assert check_integer_array("x", np.array([2**32 - 1], np.uint32)).tolist() == [2**32 - 1]


@pytest.mark.parametrize("values", [[1.0, 2.0], (3.0,), np.array([1.0, 2.0], np.float32), [1, 2.5]])
def test_float_lists_are_rejected_naming_the_argument_and_values(values):
    with pytest.raises(ValueError, match="^query_lens must have an integer dtype; got dtype float") as ei:
        check_lens("query_lens", values, min_value=1)
    assert "with values [" in str(ei.value) and "not converted" in str(ei.value)


def test_float_lens_rejected_alike_by_every_entry_point():
    from host import make_plan, paged_attention_ref
    from host.dense.gqa_packing import choose_gqa_packing

    q = np.zeros((3, 2, 4), np.float32)
    kv = np.zeros((3, 1, 4), np.float32)
    calls = {
        "query_lens": [lambda: make_plan([1.0, 2.0], [0, 3], block_size=16),
                       lambda: choose_gqa_packing([1.0, 2.0], 2, 1, context_lens=[0, 3]),
                       lambda: paged_attention_ref(q, kv, kv, np.zeros((2, 2, 1, 16, 4), np.float32),
                                                   np.zeros((2, 1), np.int32), [1.0, 2.0], [0, 3])],
        "context_lens": [lambda: make_plan([1, 2], [0.0, 3.0], block_size=16)],
    }
    for arg, fns in calls.items():
        for fn in fns:
            with pytest.raises(ValueError, match=f"^{arg} must have an integer dtype; got dtype float64"):
                fn()


# ----------------------------------------------------------------- allocate_kv_caches arguments
SIZES = dict(num_layers=2, num_blocks=4, num_kv_heads=1, block_size=8, head_size=16)


@pytest.mark.parametrize("arg, bad, fragment", [
    ("num_layers", -1, "be >= 1; got -1"), ("num_blocks", 0, "be >= 1; got 0"),
    ("num_kv_heads", 1.0, "be an integer; got 1.0"), ("block_size", True, "be an integer; got True"),
    ("head_size", np.float32(16), "be an integer"), ("num_blocks", "4", "be an integer; got '4'")])
def test_allocate_kv_caches_rejects_bad_sizes(arg, bad, fragment):
    from host.cache.cache_ops import allocate_kv_caches

    with pytest.raises(ValueError, match=f"^{arg} must ") as ei:
        allocate_kv_caches(**{**SIZES, arg: bad})
    assert fragment in str(ei.value)


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint16, bool, np.float64, np.complex64, "nope"])
def test_allocate_kv_caches_rejects_non_cache_dtypes(dtype):
    from host.cache.cache_ops import allocate_kv_caches

    with pytest.raises(ValueError, match="^dtype must (be|have dtype in) "):
        allocate_kv_caches(**SIZES, dtype=dtype)


def test_allocate_kv_caches_other_fp8_formats_are_not_implemented():
    from host.cache.cache_ops import allocate_kv_caches

    with pytest.raises(NotImplementedError, match="float8_e4m3 KV cache is not supported"):
        allocate_kv_caches(**SIZES, dtype=ml_dtypes.float8_e4m3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, "float16",
                                   ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_allocate_kv_caches_accepts_cache_dtypes_and_numpy_ints(dtype):
    from host.cache.cache_ops import allocate_kv_caches

    layers = allocate_kv_caches(np.int64(3), np.int32(4), 1, 8, 16, dtype=dtype)
    assert len(layers) == 3 and layers[0].shape == (2, 4, 1, 8, 16)
    assert layers[0].dtype == np.dtype(dtype) and not layers[2].any()
    assert layers[1].base is layers[0].base                   # views of one buffer
