"""Documented per-instruction constraints of the legacy ISA (operand dtypes, engines per
target, transposes), each as a must-pass / must-fail pair."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation
BF16 = ml_dtypes.bfloat16


@nki.jit
def matmul_dtypes_k(s, m):
    out = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.copy(nisa.nc_matmul(nl.load(s), nl.load(m))))
    return out


@pytest.mark.parametrize("ds,dm", [(np.float32, np.float32), (BF16, BF16), (np.float16, BF16)])
def test_nc_matmul_operand_dtypes(rng, ds, dm):
    s = rng.standard_normal((64, 32)).astype(ds)
    m = rng.standard_normal((64, 16)).astype(dm)
    out = nki.simulate_kernel(matmul_dtypes_k, s, m)
    np.testing.assert_allclose(out, s.astype(np.float64).T @ m.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_nc_matmul_fp32_with_bf16_fails(rng, rejects):
    # documented: if one input is fp32 (or tf32), the other must be too
    s = rng.standard_normal((64, 32)).astype(np.float32)
    m = rng.standard_normal((64, 16)).astype(BF16)
    with rejects(Exception, match=r"(?i)fp32|float32|dtype"):
        nki.simulate_kernel(matmul_dtypes_k, s, m)


@nki.jit
def act_reduce_max_k(x, *, op_name):
    out = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(np.exp, nl.load(x), reduce_op=getattr(nl, op_name), reduce_res=red)
    nl.store(out, value=red)
    return out


def test_activation_reduce_max_on_trn2(rng, target):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    with target("trn2"):
        out = nki.simulate_kernel(act_reduce_max_k, x, op_name="maximum")
    np.testing.assert_allclose(out, np.exp(x.astype(np.float64)).max(axis=1, keepdims=True), rtol=1e-6)


def test_activation_reduce_add_on_trn1_passes_max_fails(rng, target, rejects):
    # legacy nisa.activation: "on NeuronCore-v2 reduce_op only supports add"
    x = rng.standard_normal((32, 16)).astype(np.float32)
    with target("trn1"):
        out = nki.simulate_kernel(act_reduce_max_k, x, op_name="add")
        np.testing.assert_allclose(out, np.exp(x.astype(np.float64)).sum(axis=1, keepdims=True),
                                   rtol=1e-6)
        with rejects(Exception, match=r"(?i)reduce_op|add|gen2|trn1|v2"):
            nki.simulate_kernel(act_reduce_max_k, x, op_name="maximum")


@nki.jit
def tensor_scalar_engine_k(x, *, engine_name):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.tensor_scalar(nl.load(x), np.multiply, 2.0, op1=np.add, operand1=1.0,
                                           engine=getattr(nisa, engine_name)))
    return out


def test_tensor_scalar_on_scalar_engine_trn2_passes_trn1_fails(rng, target, rejects):
    # legacy tensor_scalar: ScalarE supported only on NeuronCore-v3 (and for mul/add only)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    with target("trn2"):
        out = nki.simulate_kernel(tensor_scalar_engine_k, x, engine_name="scalar_engine")
    np.testing.assert_allclose(out, 2 * x.astype(np.float64) + 1, rtol=1e-6)
    with target("trn1"), rejects(Exception, match=r"(?i)scalar|engine|gen3|trn2|v3"):
        nki.simulate_kernel(tensor_scalar_engine_k, x, engine_name="scalar_engine")



@nki.jit
def select_reduce_dtype_k(x, pred):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.select_reduce(dst=dst, predicate=nl.load(pred), on_true=nl.load(x), on_false=0.0)
    nl.store(out, value=dst)
    return out


def test_select_reduce_on_true_int32_fails_int16_passes(rng, rejects, sdk_2_26):
    # documented: on_true can be any supported dtype except tfloat32, int32, uint32
    pred = rng.integers(0, 2, size=(16, 8)).astype(np.uint8)
    x16 = rng.integers(-100, 100, size=(16, 8)).astype(np.int16)
    np.testing.assert_array_equal(nki.simulate_kernel(select_reduce_dtype_k, x16, pred),
                                  np.where(pred != 0, x16, 0))
    with rejects(Exception, match=r"(?i)int32|on_true|dtype"):
        nki.simulate_kernel(select_reduce_dtype_k, x16.astype(np.int32), pred)


@nki.jit
def nl_transpose_rank_k(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    if len(x.shape) == 3:
        tile = tile.reshape((x.shape[0], x.shape[1], x.shape[2]))
    res = nl.transpose(tile)
    nl.store(out, value=nl.copy(res))
    return out


def test_nl_transpose_of_a_3d_tile_fails(rng, rejects):
    x2 = rng.standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(nl_transpose_rank_k, x2), x2.T)
    x3 = rng.standard_normal((16, 8, 2)).astype(np.float32)
    with rejects(Exception, match=r"(?i)dimension|2d|2-d|rank"):
        nki.simulate_kernel(nl_transpose_rank_k, x3)


@nki.jit
def dma_transpose_dtype_k(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    res = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
    res[...] = nisa.dma_transpose(nl.load(x))
    nl.store(out, value=res)
    return out


@pytest.mark.parametrize("dtype", [BF16, np.float32, np.int8])
def test_dma_transpose_element_sizes_on_trn2(rng, target, rejects, dtype):
    # trn2 DMA transpose handles 2- and 4-byte dtypes
    x = (rng.standard_normal((32, 16)) * 10).astype(dtype)
    with target("trn2"):
        if np.dtype(dtype).itemsize in (2, 4):
            out = nki.simulate_kernel(dma_transpose_dtype_k, x)
            np.testing.assert_array_equal(out, x.T)
        else:
            with rejects(Exception, match=r"(?i)dtype|byte|int8"):
                nki.simulate_kernel(dma_transpose_dtype_k, x)


@nki.jit
def dma_transpose_indirect_k(data, idx):
    out = nl.ndarray((data.shape[1], idx.shape[0]), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(data.shape[1])[None, :]
    idx_tile = nl.load(idx)
    res = nl.ndarray((data.shape[1], idx.shape[0]), dtype=data.dtype, buffer=nl.sbuf)
    res[...] = nisa.dma_transpose(data[idx_tile[i_p, 0], i_f])
    nl.store(out, value=res)
    return out


def test_dma_transpose_with_indirect_indices_fails(rng, target, rejects):
    data = rng.standard_normal((40, 16)).astype(BF16)
    idx = rng.integers(0, 40, size=(32, 1)).astype(np.int32)
    with target("trn2"), rejects(Exception, match=r"(?i)indirect"):
        nki.simulate_kernel(dma_transpose_indirect_k, data, idx)


@nki.jit
def load_transpose2d_k(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load_transpose2d(x))
    return out


def test_load_transpose2d(rng):
    x = rng.standard_normal((48, 96)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(load_transpose2d_k, x), x.T)


@nki.jit
def range_select_false_k(x, lo, hi, *, fill):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    res = nisa.range_select(on_true_tile=nl.load(x), comp_op0=np.greater_equal, comp_op1=np.less,
                            bound0=nl.load(lo), bound1=nl.load(hi),
                            reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=red,
                            reduce_op=np.max, on_false_value=fill)
    nl.store(out, value=res)
    return out


def test_range_select_on_false_value_must_be_fp32_min(rng, target, rejects):
    x = rng.standard_normal((16, 32)).astype(np.float32)
    lo = np.full((16, 1), 4, np.float32)
    hi = np.full((16, 1), 20, np.float32)
    with target("trn2"):
        out = nki.simulate_kernel(range_select_false_k, x, lo, hi, fill=nl.fp32.min)
        idx = np.arange(32)[None, :]
        np.testing.assert_array_equal(out, np.where((idx >= 4) & (idx < 20), x,
                                                    np.finfo(np.float32).min))
        with rejects(Exception, match=r"(?i)on_false_value|fp32.min|FP32_MIN"):
            nki.simulate_kernel(range_select_false_k, x, lo, hi, fill=0.0)
