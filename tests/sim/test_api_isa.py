"""nki.isa ops: each op against a NumPy reference, plus a near-identical
call that must be rejected (shape, memory, dtype or target violation)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation

FP32_MIN = np.finfo(np.float32).min


# --------------------------------------------------------------------------- activation
@nki.jit
def activation_k(x, bias, *, scale, vector_scale):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    b = nl.load(bias)
    sc = nl.full((x.shape[0], 1), scale, dtype=nl.float32) if vector_scale else scale
    nl.store(out, value=nisa.activation(op=nl.exp, data=tile, bias=b, scale=sc))
    return out


@pytest.mark.parametrize("vector_scale", [False, True])
def test_activation_exp_scale_bias(rng, vector_scale):
    x = rng.uniform(-2, 2, size=(128, 64)).astype(np.float32)
    bias = rng.uniform(-1, 1, size=(128, 1)).astype(np.float32)
    out = nki.simulate_kernel(activation_k, x, bias, scale=0.5, vector_scale=vector_scale)
    np.testing.assert_allclose(out, np.exp(0.5 * x.astype(np.float64) + bias), rtol=1e-5)


def test_activation_bias_with_two_columns_fails(rng, rejects):
    x = rng.uniform(-2, 2, size=(128, 64)).astype(np.float32)
    bias = rng.uniform(-1, 1, size=(128, 2)).astype(np.float32)
    with rejects(Exception, match=r"(?i)bias"):
        nki.simulate_kernel(activation_k, x, bias, scale=0.5, vector_scale=False)


@nki.jit
def activation_reduce_k(x, bias, *, out_dtype):
    out = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.shared_hbm)
    sums = nl.ndarray((x.shape[0], bias.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], bias.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    tile = nl.load(x)
    b = nl.load(bias[:, 0:1])
    res = nisa.activation_reduce(np.exp, tile, bias=b, scale=1.0, reduce_op=nl.add,
                                 reduce_res=red, dtype=out_dtype)
    nl.store(out, value=res)
    nl.store(sums, value=red)
    return out, sums


def test_activation_reduce_sums_the_fp32_results(rng):
    x = rng.uniform(-2, 2, size=(128, 96)).astype(np.float32)
    bias = rng.uniform(-1, 1, size=(128, 1)).astype(np.float32)
    out, sums = nki.simulate_kernel(activation_reduce_k, x, bias, out_dtype=ml_dtypes.bfloat16)
    ref = np.exp(x.astype(np.float64) + bias)
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=8e-3)   # bf16 output
    np.testing.assert_allclose(sums, ref.sum(axis=1, keepdims=True), rtol=1e-5)


def test_activation_reduce_result_must_be_one_column(rng, rejects):
    x = rng.uniform(-2, 2, size=(128, 96)).astype(np.float32)
    bias = rng.uniform(-1, 1, size=(128, 2)).astype(np.float32)    # makes reduce_res (128, 2)
    with rejects(Exception, match=r"(?i)reduce_res|shape"):
        nki.simulate_kernel(activation_reduce_k, x, bias, out_dtype=np.float32)


# --------------------------------------------------------------------------- tensor_scalar / tensor_tensor
@nki.jit
def tensor_scalar_k(x, operand):
    out1 = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    out2 = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    vec = nl.load(operand)
    nl.store(out1, value=nisa.tensor_scalar(tile, np.multiply, 2.0, op1=np.add, operand1=vec))
    nl.store(out2, value=nisa.tensor_scalar(tile, np.subtract, 1.0, reverse0=True))
    return out1, out2


def test_tensor_scalar_two_ops_and_reverse(rng):
    x = rng.standard_normal((128, 40)).astype(np.float32)
    v = rng.standard_normal((128, 1)).astype(np.float32)
    out1, out2 = nki.simulate_kernel(tensor_scalar_k, x, v)
    np.testing.assert_allclose(out1, 2.0 * x.astype(np.float64) + v, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out2, 1.0 - x.astype(np.float64), rtol=1e-6, atol=1e-6)


def test_tensor_scalar_operand_must_be_a_column(rng, rejects):
    x = rng.standard_normal((128, 40)).astype(np.float32)
    v = rng.standard_normal((128, 40)).astype(np.float32)     # a full tile is not a scalar operand
    with rejects(Exception, match=r"(?i)operand|scalar|shape"):
        nki.simulate_kernel(tensor_scalar_k, x, v)


@nki.jit
def tensor_tensor_k(a, b, *, op, b_in_psum, a_in_psum):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    if a_in_psum:
        xp = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.psum)
        xp[...] = nl.copy(x)
        x = xp
    if b_in_psum:
        yp = nl.ndarray(b.shape, dtype=nl.float32, buffer=nl.psum)
        yp[...] = nl.copy(y)
        y = yp
    nl.store(out, value=nisa.tensor_tensor(x, y, op=getattr(np, op)))
    return out


@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "maximum", "minimum"])
@pytest.mark.parametrize("b_in_psum", [False, True])
def test_tensor_tensor(rng, op, b_in_psum):
    a = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((128, 64)).astype(np.float32)
    out = nki.simulate_kernel(tensor_tensor_k, a, b, op=op, b_in_psum=b_in_psum, a_in_psum=False)
    np.testing.assert_allclose(out, getattr(np, op)(a.astype(np.float64), b), rtol=1e-6, atol=1e-6)


def test_tensor_tensor_partition_mismatch_fails(rng, rejects):
    a = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    # documented: "number of partitions (dimension 0 size of a tile) mismatch in parameters"
    with rejects(Exception, match=r"(?i)number of partitions|partition.*mismatch"):
        nki.simulate_kernel(tensor_tensor_k, a, b, op="add", b_in_psum=False, a_in_psum=False)


def test_tensor_tensor_both_inputs_in_psum_fails(rng, rejects):
    a = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((128, 64)).astype(np.float32)
    with rejects(Exception, match=r"(?i)psum"):
        nki.simulate_kernel(tensor_tensor_k, a, b, op="add", b_in_psum=True, a_in_psum=True)


# --------------------------------------------------------------------------- tensor_reduce / copy
@nki.jit
def tensor_reduce_k(x, *, op, axis, negate):
    tile = nl.load(x)
    res = nisa.tensor_reduce(getattr(np, op), tile, axis=axis, negate=negate, keepdims=True,
                             dtype=nl.float32)
    out = nl.ndarray(res.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=res)
    return out


@pytest.mark.parametrize("op,negate", [("max", False), ("add", True), ("min", False)])
def test_tensor_reduce(rng, op, negate):
    x = rng.standard_normal((128, 4, 32)).astype(np.float32)
    out = nki.simulate_kernel(tensor_reduce_k, x, op=op, axis=(1, 2), negate=negate)
    ref = {"max": np.max, "add": np.sum, "min": np.min}[op](x.astype(np.float64), axis=(1, 2),
                                                           keepdims=True)
    np.testing.assert_allclose(out, -ref if negate else ref, rtol=1e-5, atol=1e-5)


def test_tensor_reduce_over_partition_axis_fails(rng, rejects):
    x = rng.standard_normal((128, 4, 32)).astype(np.float32)
    with rejects(Exception, match=r"(?i)axis|partition"):
        nki.simulate_kernel(tensor_reduce_k, x, op="max", axis=(0,), negate=False)


@nki.jit
def tensor_copy_k(x, *, engine_name, from_psum):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    if from_psum:
        src = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        src[...] = nl.copy(tile, dtype=nl.float32)
    else:
        src = tile
    nl.store(out, value=nisa.tensor_copy(src, dtype=x.dtype, engine=getattr(nisa, engine_name)))
    return out


@pytest.mark.parametrize("engine", ["vector_engine", "gpsimd_engine"])
def test_tensor_copy_int32_is_bit_exact(rng, engine):
    x = rng.integers(-(2**31), 2**31 - 1, size=(128, 32), dtype=np.int64).astype(np.int32)
    out = nki.simulate_kernel(tensor_copy_k, x, engine_name=engine, from_psum=False)
    np.testing.assert_array_equal(out, x)


def test_tensor_copy_from_psum_vector_passes_gpsimd_fails(rng, rejects):
    x = rng.standard_normal((128, 32)).astype(np.float32)
    out = nki.simulate_kernel(tensor_copy_k, x, engine_name="vector_engine", from_psum=True)
    np.testing.assert_array_equal(out, x)
    with rejects(Exception, match=r"(?i)gpsimd|psum"):
        nki.simulate_kernel(tensor_copy_k, x, engine_name="gpsimd_engine", from_psum=True)


# --------------------------------------------------------------------------- iota / memset / reciprocal
@nki.jit
def iota_k(*, parts, cols, two_d):
    out = nl.ndarray((parts, cols), dtype=nl.int32, buffer=nl.shared_hbm)
    if two_d:
        expr = nl.arange(parts)[:, None] * 1000 + nl.arange(cols)[None, :]
    else:
        expr = nl.arange(parts)                   # 1-D arange: must be lifted to 2-D
    nl.store(out, value=nisa.iota(expr, dtype=nl.int32))
    return out


def test_iota_2d():
    out = nki.simulate_kernel(iota_k, parts=128, cols=20, two_d=True)
    np.testing.assert_array_equal(out, np.arange(128)[:, None] * 1000 + np.arange(20)[None, :])


def test_iota_over_128_partitions_fails(rejects):
    with rejects(Exception, match=r"(?i)partition|128"):
        nki.simulate_kernel(iota_k, parts=256, cols=20, two_d=True)


def test_iota_of_1d_arange_fails(rejects):
    with rejects(Exception, match=r"(?i)1d|1-d|arange|dimension"):
        nki.simulate_kernel(iota_k, parts=128, cols=1, two_d=False)


@nki.jit
def memset_k(*, parts, cols, value, dtype):
    out = nl.ndarray((parts, cols), dtype=dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.memset(shape=(parts, cols), value=value, dtype=dtype))
    return out


@pytest.mark.parametrize("dtype,value", [(np.float32, 3.5), (ml_dtypes.bfloat16, -1.25), (np.int32, 7)])
def test_memset(dtype, value):
    out = nki.simulate_kernel(memset_k, parts=128, cols=33, value=value, dtype=dtype)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, np.full((128, 33), value, dtype))


def test_memset_over_128_partitions_fails(rejects):
    with rejects(Exception, match=r"(?i)partition|128"):
        nki.simulate_kernel(memset_k, parts=129, cols=33, value=1.0, dtype=np.float32)


@nki.jit
def reciprocal_k(x, *, on_hbm):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    src = x if on_hbm else nl.load(x)
    nl.store(out, value=nisa.reciprocal(src))
    return out


def test_reciprocal(rng):
    x = (rng.uniform(0.1, 10, size=(128, 64)) * rng.choice([-1, 1], (128, 64))).astype(np.float32)
    out = nki.simulate_kernel(reciprocal_k, x, on_hbm=False)
    np.testing.assert_allclose(out, 1.0 / x.astype(np.float64), rtol=1e-6)


def test_reciprocal_of_hbm_tensor_fails(rng, rejects):
    x = rng.uniform(0.1, 10, size=(128, 64)).astype(np.float32)
    with rejects(Exception, match=r"(?i)hbm|sbuf|address space|memory"):
        nki.simulate_kernel(reciprocal_k, x, on_hbm=True)


# --------------------------------------------------------------------------- selects
@nki.jit
def affine_select_k(x, *, in_psum, out_psum=False):
    n = x.shape[0]
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(n)[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    tile = nl.load(x)
    if in_psum:
        src = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        src[...] = nl.copy(tile)
    else:
        src = tile
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum if out_psum else nl.sbuf)
    dst[...] = nisa.affine_select(pred=(i_f <= i_p), on_true_tile=src, on_false_value=-9984.0)
    nl.store(out, value=nl.copy(dst))
    return out


@pytest.mark.parametrize("in_psum", [False, True], ids=["sbuf", "psum"])
def test_affine_select_causal(rng, in_psum):
    # a PSUM on_true_tile is legal in the legacy API (AWS's SD-attention tutorial and flash
    # attention kernels mask their PSUM scores this way)
    x = rng.standard_normal((128, 128)).astype(np.float32)
    out = nki.simulate_kernel(affine_select_k, x, in_psum=in_psum)
    keep = np.arange(128)[None, :] <= np.arange(128)[:, None]
    np.testing.assert_array_equal(out, np.where(keep, x, np.float32(-9984.0)))


def test_affine_select_result_into_psum_fails(rng, rejects):
    # GpSimd writes SBUF only: the selected tile cannot be assigned to a PSUM tensor
    x = rng.standard_normal((128, 128)).astype(np.float32)
    with rejects(Exception, match=r"(?i)gpsimd|psum"):
        nki.simulate_kernel(affine_select_k, x, in_psum=True, out_psum=True)



@nki.jit
def select_reduce_k(x, pred, *, reverse):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    mx = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    red = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=dst, predicate=nl.load(pred), on_true=nl.load(x), on_false=-9984.0,
                       reduce_res=red, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                       reduce_op=np.max, reverse_pred=reverse)
    nl.store(out, value=dst)
    nl.store(mx, value=red)
    return out, mx


@pytest.mark.parametrize("reverse", [False, True])
def test_select_reduce(rng, reverse, sdk_2_26):
    x = rng.standard_normal((128, 48)).astype(np.float32)
    pred = rng.integers(0, 2, size=(128, 48)).astype(np.uint8)
    pred[:, 0] = 1 - reverse            # every row keeps at least one element
    out, mx = nki.simulate_kernel(select_reduce_k, x, pred, reverse=reverse)
    keep = (pred != 0) ^ reverse
    ref = np.where(keep, x, np.float32(-9984.0))
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(mx, ref.max(axis=1, keepdims=True))


def test_select_reduce_float_predicate_fails(rng, rejects, sdk_2_26):
    x = rng.standard_normal((128, 48)).astype(np.float32)
    pred = rng.integers(0, 2, size=(128, 48)).astype(np.float32)   # predicate must be an integer type
    with rejects(Exception, match=r"(?i)predicate|dtype"):
        nki.simulate_kernel(select_reduce_k, x, pred, reverse=False)


def test_select_reduce_absent_before_sdk_2_26(sim_only):
    import nki_sim
    with nki_sim.configure(sdk="2.24"):
        assert not hasattr(nisa, "select_reduce")
        with pytest.raises(AttributeError, match="2.26"):
            nki.simulate_kernel(select_reduce_k, np.zeros((4, 4), np.float32),
                                np.ones((4, 4), np.uint8), reverse=False)
    with nki_sim.configure(sdk="2.26"):
        assert hasattr(nisa, "select_reduce")


@nki.jit
def range_select_k(x, lo, hi, *, start):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    mx = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    res = nisa.range_select(on_true_tile=nl.load(x), comp_op0=np.greater_equal, comp_op1=np.less,
                            bound0=nl.load(lo), bound1=nl.load(hi),
                            reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=red,
                            reduce_op=np.max, range_start=start, on_false_value=nl.fp32.min)
    nl.store(out, value=res)
    nl.store(mx, value=red)
    return out, mx


def _range_select_inputs(rng):
    x = rng.standard_normal((128, 64)).astype(np.float32)
    lo = rng.integers(0, 40, size=(128, 1)).astype(np.float32)
    hi = lo + rng.integers(1, 30, size=(128, 1)).astype(np.float32)
    return x, lo, hi


def test_range_select_on_trn2(rng, target):
    x, lo, hi = _range_select_inputs(rng)
    with target("trn2"):
        out, mx = nki.simulate_kernel(range_select_k, x, lo, hi, start=5)
    idx = 5 + np.arange(64)[None, :]
    ref = np.where((idx >= lo) & (idx < hi), x, FP32_MIN)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(mx, ref.max(axis=1, keepdims=True))


def test_range_select_on_trn1_is_rejected(rng, target, rejects):
    x, lo, hi = _range_select_inputs(rng)
    with target("trn1"), rejects(Exception, match=r"(?i)gen3|trn2|v3|not (supported|available)"):
        nki.simulate_kernel(range_select_k, x, lo, hi, start=5)


# --------------------------------------------------------------------------- dma_copy / dma_transpose
@nki.jit
def dma_copy_k(x, *, rows):
    out = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=buf, src=x[0:rows, :])
    nisa.dma_copy(dst=out, src=buf)
    return out


def test_dma_copy_hbm_sbuf_round_trip(rng):
    x = rng.standard_normal((128, 80)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(dma_copy_k, x, rows=128), x)


def test_dma_copy_more_than_128_partitions_fails(rng, rejects):
    x = rng.standard_normal((256, 80)).astype(np.float32)
    with rejects(Exception, match=r"(?i)partition|128"):
        nki.simulate_kernel(dma_copy_k, x, rows=256)


@nki.jit
def dma_transpose_k(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    res = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
    res[...] = nisa.dma_transpose(nl.load(x))
    nl.store(out, value=res)
    return out


def test_dma_transpose_on_trn2(rng, target):
    x = rng.standard_normal((128, 64)).astype(ml_dtypes.bfloat16)
    with target("trn2"):
        out = nki.simulate_kernel(dma_transpose_k, x)
    np.testing.assert_array_equal(out.view(np.uint16), x.T.view(np.uint16))


def test_dma_transpose_on_trn1_is_rejected(rng, target, rejects):
    x = rng.standard_normal((128, 64)).astype(ml_dtypes.bfloat16)
    with target("trn1"), rejects(Exception, match=r"(?i)gen3|trn2|v3|not (supported|available)"):
        nki.simulate_kernel(dma_transpose_k, x)


@nki.jit
def copy_predicated_k(src, dst, pred, *, reverse):
    out = nl.ndarray(dst.shape, dtype=dst.dtype, buffer=nl.shared_hbm)
    d = nl.load(dst)
    nisa.tensor_copy_predicated(src=nl.load(src), dst=d, predicate=nl.load(pred), reverse_pred=reverse)
    nl.store(out, value=d)
    return out


@pytest.mark.parametrize("reverse", [False, True])
def test_tensor_copy_predicated(rng, reverse):
    src = rng.standard_normal((64, 16)).astype(np.float32)
    dst = rng.standard_normal((64, 16)).astype(np.float32)
    pred = rng.integers(0, 2, size=(64, 16)).astype(np.uint8)
    out = nki.simulate_kernel(copy_predicated_k, src, dst, pred, reverse=reverse)
    np.testing.assert_array_equal(out, np.where((pred != 0) ^ reverse, src, dst))


@nki.jit
def activation_accumulate_k(a, b):
    """ScalarE accumulators: reset_reduce over exp(a), then reduce over exp(b) reading the
    registers out: r = sum(exp(a)) + sum(exp(b)) per partition."""
    out = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    r = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(op=nl.exp, data=nl.load(a), reduce_op=nl.add,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.activation(op=nl.exp, data=nl.load(b), reduce_op=nl.add, reduce_res=r,
                    reduce_cmd=nisa.reduce_cmd.reduce)
    nl.store(out, value=r)
    return out


def test_activation_reduce_cmd_accumulates_across_instructions(rng):
    a = rng.uniform(-1, 1, size=(32, 16)).astype(np.float32)
    b = rng.uniform(-1, 1, size=(32, 24)).astype(np.float32)
    out = nki.simulate_kernel(activation_accumulate_k, a, b)
    ref = np.exp(a.astype(np.float64)).sum(1, keepdims=True) + np.exp(b.astype(np.float64)).sum(1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=1e-5)


@nki.jit
def select_reduce_accumulate_k(x1, p1, x2, p2):
    """Vector accumulators: select_reduce reset_reduce over (x1, p1) then reduce over (x2, p2):
    the read-out is the max over both selections."""
    out = nl.ndarray((x1.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    d1 = nl.ndarray(x1.shape, dtype=nl.float32, buffer=nl.sbuf)
    d2 = nl.ndarray(x2.shape, dtype=nl.float32, buffer=nl.sbuf)
    r = nl.ndarray((x1.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=d1, predicate=nl.load(p1), on_true=nl.load(x1), on_false=-9984.0,
                       reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=np.max)
    nisa.select_reduce(dst=d2, predicate=nl.load(p2), on_true=nl.load(x2), on_false=-9984.0,
                       reduce_res=r, reduce_cmd=nisa.reduce_cmd.reduce, reduce_op=np.max)
    nl.store(out, value=r)
    return out


def test_select_reduce_accumulates_across_instructions(rng, sdk_2_26):
    x1 = rng.standard_normal((32, 16)).astype(np.float32)
    x2 = rng.standard_normal((32, 8)).astype(np.float32)
    p1 = rng.integers(0, 2, size=(32, 16)).astype(np.uint8)
    p2 = rng.integers(0, 2, size=(32, 8)).astype(np.uint8)
    out = nki.simulate_kernel(select_reduce_accumulate_k, x1, p1, x2, p2)
    ref = np.maximum(np.where(p1 != 0, x1, -9984.0).max(1), np.where(p2 != 0, x2, -9984.0).max(1))
    np.testing.assert_array_equal(out[:, 0], ref.astype(np.float32))
