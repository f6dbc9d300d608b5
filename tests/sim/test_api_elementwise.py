"""nki.language element-wise binary ops, operators, unary math, comparisons / logical /
bitwise ops, reductions and where: each family has must-pass tests against NumPy and
near-identical must-fail tests."""

from __future__ import annotations

import math

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation


@nki.jit
def binary_op(a, b, *, op):
    """nl.<op>(a, b) with NumPy broadcasting, fp32 result."""
    shape = (max(a.shape[0], b.shape[0]), max(a.shape[1], b.shape[1]))   # no host-side check
    out = nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)
    res = getattr(nl, op)(nl.load(a), nl.load(b), dtype=nl.float32)
    nl.store(out, value=res)
    return out


@nki.jit
def binary_op_scalar(a, *, op, scalar):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=getattr(nl, op)(nl.load(a), scalar))
    return out


BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "power": np.power, "fmod": np.fmod,
}


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("shapes", [((128, 64), (128, 64)), ((1, 64), (128, 64)),
                                    ((128, 1), (128, 64))], ids=["same", "pbcast", "fbcast"])
def test_binary_ops_with_broadcasting(rng, op, shapes):
    a = rng.uniform(0.5, 2.0, size=shapes[0]).astype(np.float32)
    b = rng.uniform(-2.0, 2.0, size=shapes[1]).astype(np.float32)
    out = nki.simulate_kernel(binary_op, a, b, op=op)
    ref = BINARY[op](a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["add", "multiply", "subtract", "maximum"])
def test_binary_ops_with_python_scalar(rng, op):
    a = rng.standard_normal((64, 32)).astype(np.float32)
    out = nki.simulate_kernel(binary_op_scalar, a, op=op, scalar=0.75)
    np.testing.assert_allclose(out, BINARY[op](a.astype(np.float64), 0.75), rtol=1e-6, atol=1e-7)


def test_binary_op_partition_mismatch_fails(rng, rejects):
    a = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    with rejects(Exception, match=r"(?i)partition|broadcast|mismatch"):
        nki.simulate_kernel(binary_op, a, b, op="add")


@nki.jit
def operators(a, b):
    """Tile operator overloads (same shapes): returns (a + b*2 - b/4, a*a, -a, a ** 2)."""
    out1 = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    out2 = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    nl.store(out1, value=x + y * 2.0 - y / 4.0)
    nl.store(out2, value=(-x) * x + x ** 2)
    return out1, out2


def test_tile_operators(rng):
    a = rng.standard_normal((128, 48)).astype(np.float32)
    b = rng.standard_normal((128, 48)).astype(np.float32)
    out1, out2 = nki.simulate_kernel(operators, a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(out1, a64 + 2 * b64 - b64 / 4, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out2, np.zeros_like(a64), atol=1e-5)


@nki.jit
def operator_partition_broadcast(a, b):
    out = nl.ndarray(b.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(a) + nl.load(b))      # (1, F) + (P, F) with an operator
    return out


def test_operator_partition_broadcast_is_rejected(rng, rejects):
    # "Partition dimension broadcasting is not supported on operator overloads" (known issue)
    a = rng.standard_normal((1, 64)).astype(np.float32)
    b = rng.standard_normal((128, 64)).astype(np.float32)
    with rejects(Exception, match=r"(?i)partition"):
        nki.simulate_kernel(operator_partition_broadcast, a, b)


# --------------------------------------------------------------------------- unary math
@nki.jit
def unary_op(a, *, op):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=getattr(nl, op)(nl.load(a), dtype=nl.float32))
    return out


@nki.jit
def unary_op_on_hbm(a, *, op):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=getattr(nl, op)(a, dtype=nl.float32))   # compute op on an HBM tensor
    return out


_erf = np.vectorize(math.erf)
UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x, "negative": np.negative, "abs": np.abs, "sign": np.sign,
    "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x / (1 + np.exp(-x)), "softplus": lambda x: np.log1p(np.exp(x)),
    "square": np.square, "sin": np.sin, "cos": np.cos,
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "erf": _erf, "tan": np.tan, "arctan": np.arctan, "ceil": np.ceil, "floor": np.floor,
    "trunc": np.trunc, "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
}
POSITIVE_ONLY = {"log", "sqrt", "rsqrt"}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_math(rng, op):
    lo = 0.05 if op in POSITIVE_ONLY else -3.0
    hi = 1.4 if op in ("tan", "arctan") else 3.0          # documented valid input ranges
    a = rng.uniform(-hi if op in ("tan", "arctan") else lo, hi, size=(128, 40)).astype(np.float32)
    out = nki.simulate_kernel(unary_op, a, op=op)
    atol = 2e-3 if op == "gelu" else 1e-5        # tanh-approximated GELU is within 1e-3
    np.testing.assert_allclose(out, UNARY[op](a.astype(np.float64)), rtol=1e-5, atol=atol)


@pytest.mark.parametrize("op", ["exp", "sqrt"])
def test_unary_math_on_hbm_operand_fails(rng, op, rejects):
    a = rng.uniform(0.1, 1.0, size=(128, 40)).astype(np.float32)
    with rejects(Exception, match=r"(?i)hbm|sbuf|address space|memory"):
        nki.simulate_kernel(unary_op_on_hbm, a, op=op)


# --------------------------------------------------------------------------- comparisons / logical
@nki.jit
def compare_op(a, b, *, op):
    out = nl.ndarray(a.shape, dtype=nl.uint8, buffer=nl.shared_hbm)
    nl.store(out, value=getattr(nl, op)(nl.load(a), nl.load(b), dtype=nl.uint8))
    return out


COMPARE = {"equal": np.equal, "not_equal": np.not_equal, "greater": np.greater,
           "greater_equal": np.greater_equal, "less": np.less, "less_equal": np.less_equal}


@pytest.mark.parametrize("op", sorted(COMPARE))
def test_comparisons(rng, op):
    a = rng.integers(-3, 4, size=(128, 32)).astype(np.float32)     # many exact ties
    b = rng.integers(-3, 4, size=(128, 32)).astype(np.float32)
    out = nki.simulate_kernel(compare_op, a, b, op=op)
    np.testing.assert_array_equal(out, COMPARE[op](a, b).astype(np.uint8))


@nki.jit
def logical_ops(a, b):
    """a, b uint8 0/1 -> (and, or, xor, not a) as uint8."""
    o_and = nl.ndarray(a.shape, dtype=nl.uint8, buffer=nl.shared_hbm)
    o_or = nl.ndarray(a.shape, dtype=nl.uint8, buffer=nl.shared_hbm)
    o_xor = nl.ndarray(a.shape, dtype=nl.uint8, buffer=nl.shared_hbm)
    o_not = nl.ndarray(a.shape, dtype=nl.uint8, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    nl.store(o_and, value=nl.logical_and(x, y, dtype=nl.uint8))
    nl.store(o_or, value=nl.logical_or(x, y, dtype=nl.uint8))
    nl.store(o_xor, value=nl.logical_xor(x, y, dtype=nl.uint8))
    nl.store(o_not, value=nl.logical_not(x, dtype=nl.uint8))
    return o_and, o_or, o_xor, o_not


def test_logical_ops(rng):
    a = rng.integers(0, 2, size=(128, 32)).astype(np.uint8)
    b = rng.integers(0, 2, size=(128, 32)).astype(np.uint8)
    res = nki.simulate_kernel(logical_ops, a, b)
    a_b, b_b = a.astype(bool), b.astype(bool)
    for got, ref in zip(res, [a_b & b_b, a_b | b_b, a_b ^ b_b, ~a_b]):
        np.testing.assert_array_equal(got, ref.astype(np.uint8))


@nki.jit
def bitwise_ops(a, b):
    o_and = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    o_or = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    o_xor = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    o_inv = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    o_shl = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    o_shr = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    nl.store(o_and, value=nl.bitwise_and(x, y))
    nl.store(o_or, value=nl.bitwise_or(x, y))
    nl.store(o_xor, value=nl.bitwise_xor(x, y))
    nl.store(o_inv, value=nl.invert(x))
    nl.store(o_shl, value=nl.left_shift(x, 3))
    nl.store(o_shr, value=nl.right_shift(x, 2))
    return o_and, o_or, o_xor, o_inv, o_shl, o_shr


def test_bitwise_ops_int32(rng):
    a = rng.integers(0, 2**20, size=(128, 16)).astype(np.int32)
    b = rng.integers(0, 2**20, size=(128, 16)).astype(np.int32)
    res = nki.simulate_kernel(bitwise_ops, a, b)
    refs = [a & b, a | b, a ^ b, ~a, a << 3, a >> 2]
    for got, ref in zip(res, refs):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, ref)


@nki.jit
def branch_on_tile(a, b):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    if x > y:                                # a tensor has no truth value
        nl.store(out, value=x)
    else:
        nl.store(out, value=y)
    return out


def test_truth_value_of_a_tile_is_an_error(rng, rejects):
    a = rng.standard_normal((128, 8)).astype(np.float32)
    with rejects(ValueError, match=r"(?i)truth value"):
        nki.simulate_kernel(branch_on_tile, a, a + 1)


# --------------------------------------------------------------------------- reductions
@nki.jit
def reduce_op(a, *, op, axis, keepdims):
    x = nl.load(a)
    res = getattr(nl, op)(x, axis=axis, dtype=nl.float32, keepdims=keepdims)
    out = nl.ndarray(res.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=res)
    return out


REDUCE = {"max": np.max, "min": np.min, "sum": np.sum, "prod": np.prod, "mean": np.mean,
          "var": np.var}


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("shape,axis", [((128, 64), 1), ((128, 4, 16), (1, 2)),
                                        ((96, 4, 16), 2)], ids=["2d", "3d-both", "3d-last"])
def test_reductions(rng, op, shape, axis):
    a = rng.uniform(0.9, 1.1, size=shape).astype(np.float32)
    out = nki.simulate_kernel(reduce_op, a, op=op, axis=axis, keepdims=False)
    ref = REDUCE[op](a.astype(np.float64), axis=axis)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5)


def test_reduction_keepdims(rng):
    a = rng.standard_normal((128, 64)).astype(np.float32)
    out = nki.simulate_kernel(reduce_op, a, op="max", axis=1, keepdims=True)
    np.testing.assert_array_equal(out, a.max(axis=1, keepdims=True))


@pytest.mark.parametrize("shape,axis", [((128, 64), 0), ((128, 4, 16), 1)],
                         ids=["partition-axis", "not-trailing"])
def test_reduction_on_illegal_axis_fails(rng, shape, axis, rejects):
    a = rng.standard_normal(shape).astype(np.float32)
    with rejects(Exception, match=r"(?i)axis|partition|dim"):
        nki.simulate_kernel(reduce_op, a, op="sum", axis=axis, keepdims=False)


# --------------------------------------------------------------------------- where
@nki.jit
def where_kernel(cond, a, *, fill):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.where(nl.load(cond), nl.load(a), fill, dtype=nl.float32))
    return out


def test_where_with_scalar_fill(rng):
    cond = rng.integers(0, 2, size=(128, 64)).astype(np.uint8)
    a = rng.standard_normal((128, 64)).astype(np.float32)
    out = nki.simulate_kernel(where_kernel, cond, a, fill=-9984.0)
    np.testing.assert_array_equal(out, np.where(cond != 0, a, np.float32(-9984.0)))


def test_where_shape_mismatch_fails(rng, rejects):
    cond = rng.integers(0, 2, size=(128, 32)).astype(np.uint8)
    a = rng.standard_normal((128, 64)).astype(np.float32)
    with rejects(Exception, match=r"(?i)shape|broadcast|mismatch"):
        nki.simulate_kernel(where_kernel, cond, a, fill=-9984.0)


@nki.jit
def augmented_assign_k(x):
    """t[:, 0:4] *= 2; t[:, 4:8] += 1; t[:, 8:12] -= t[:, 0:4]; t[:, 12:16] /= 4 (in place)."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    t[:, 0:4] *= 2.0
    t[:, 4:8] += 1.0
    t[:, 8:12] -= t[:, 0:4]
    t[:, 12:16] /= 4.0
    nl.store(out, value=t)
    return out


def test_augmented_assignment_writes_through(rng):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    out = nki.simulate_kernel(augmented_assign_k, x)
    ref = x.astype(np.float64).copy()
    ref[:, 0:4] *= 2
    ref[:, 4:8] += 1
    ref[:, 8:12] -= ref[:, 0:4]
    ref[:, 12:16] /= 4
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)


@nki.jit
def mod_k(a, b):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.mod(nl.load(a), nl.load(b)))
    return out


def test_mod_of_positive_operands(rng):
    a = rng.uniform(0, 20, size=(32, 16)).astype(np.float32)
    b = rng.uniform(0.5, 3, size=(32, 16)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(mod_k, a, b),
                               np.mod(a.astype(np.float64), b), rtol=1e-5, atol=1e-5)
