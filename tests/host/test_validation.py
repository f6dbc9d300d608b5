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
