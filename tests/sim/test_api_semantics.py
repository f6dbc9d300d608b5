"""Finer legacy semantics: masked compute, type promotion, float->int casts, poison,
assignment shapes, PSUM assign vs accumulate, affine_range false positives, index forms
(mgrid, strided SBUF reads, iota of a program id), integer exactness."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt

pytestmark = pytest.mark.simulation
BF16 = ml_dtypes.bfloat16


# --------------------------------------------------------------------------- masked compute
@nki.jit
def masked_exp_k(x, *, rows, cols):
    """t = x + 100 everywhere, then t[i_p, i_f] = exp(x) only where (i_p < rows) & (i_f < cols)."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    tile = nl.load(x)
    t = nl.add(tile, 100.0)
    t[i_p, i_f] = nl.exp(tile[i_p, i_f], mask=(i_p < rows) & (i_f < cols))
    nl.store(out, value=t)
    return out


def test_masked_compute_writes_only_the_masked_elements(rng):
    x = rng.standard_normal((128, 64)).astype(np.float32)
    out = nki.simulate_kernel(masked_exp_k, x, rows=70, cols=40)
    ref = x.astype(np.float64) + 100
    ref[:70, :40] = np.exp(x[:70, :40].astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-6)


# --------------------------------------------------------------------------- promotion
@nki.jit
def promotion_k(a_bf16, b_f16, c_i8):
    """Checks result dtypes of mixed-dtype ops inside the kernel (NKI type promotion)."""
    out = nl.ndarray(a_bf16.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.load(a_bf16)
    b = nl.load(b_f16)
    c = nl.load(c_i8)
    weak_float = nl.multiply(a, 0.125)           # python float is weak float32
    assert weak_float.dtype == np.dtype(np.float32), weak_float.dtype
    mixed = nl.add(a, b)                         # (bf16, f16) -> f32
    assert mixed.dtype == np.dtype(np.float32), mixed.dtype
    weak_int = nl.add(c, 2)                      # (int8, python int) -> int32
    assert weak_int.dtype == np.dtype(np.int32), weak_int.dtype
    int_float = nl.add(c, a)                     # (int, float) -> the float
    assert int_float.dtype == np.dtype(BF16), int_float.dtype
    same = nl.add(a, a)                          # (bf16, bf16) -> bf16
    assert same.dtype == np.dtype(BF16), same.dtype
    forced = nl.add(a, 0.125, dtype=nl.bfloat16)  # explicit dtype wins
    assert forced.dtype == np.dtype(BF16), forced.dtype
    nl.store(out, value=nl.add(mixed, weak_float))
    return out


def test_type_promotion_rules(rng):
    a = rng.standard_normal((16, 8)).astype(BF16)
    b = rng.standard_normal((16, 8)).astype(np.float16)
    c = rng.integers(-5, 5, size=(16, 8)).astype(np.int8)
    out = nki.simulate_kernel(promotion_k, a, b, c)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(out, a64 + b64 + a64 * 0.125, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- float -> int
@nki.jit
def float_to_int_k(x):
    """x fp32 -> (copy to int32, copy to int8, DMA store of the fp32 tile into int32 HBM)."""
    o32 = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    o8 = nl.ndarray(x.shape, dtype=nl.int8, buffer=nl.shared_hbm)
    o_dma = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    nl.store(o32, value=nl.copy(tile, dtype=nl.int32))
    nl.store(o8, value=nl.copy(tile, dtype=nl.int8))
    nl.store(o_dma, value=tile)
    return o32, o8, o_dma


def test_float_to_int_rounds_half_even_and_saturates():
    vals = np.array([2.5, 3.5, -2.5, -0.5, 0.5, 1.49, -1.51, 126.5, 127.5, -128.5, -300.0, 1e10,
                     -1e10, 2147483520.0, 3e9, -3e9], np.float32)
    x = np.tile(vals, (4, 1))
    o32, o8, o_dma = nki.simulate_kernel(float_to_int_k, x)
    r = np.rint(x.astype(np.float64))                              # ties to even
    np.testing.assert_array_equal(o32, np.clip(r, -(2**31), 2**31 - 1).astype(np.int64))
    np.testing.assert_array_equal(o8, np.clip(r, -128, 127).astype(np.int64))
    np.testing.assert_array_equal(o_dma, o32)


# --------------------------------------------------------------------------- poison
@nki.jit
def half_written_k(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out[0:x.shape[0] // 2, :], value=nl.load(x[0:x.shape[0] // 2, :]))
    return out


def test_unwritten_output_elements_are_nan_poisoned(rng, sim_only):
    x = rng.standard_normal((64, 8)).astype(np.float32)
    out = nki.simulate_kernel(half_written_k, x)
    np.testing.assert_array_equal(out[:32], x[:32])
    assert np.isnan(out[32:]).all()


# --------------------------------------------------------------------------- assignment shapes
@nki.jit
def assign_k(x, *, dst_cols):
    out = nl.ndarray((x.shape[0], dst_cols), dtype=x.dtype, buffer=nl.shared_hbm)
    dst = nl.ndarray((x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    dst[...] = nl.load(x)
    small = nl.ndarray((x.shape[0], dst_cols), dtype=x.dtype, buffer=nl.sbuf)
    small[:, 0:dst_cols] = dst                   # value (P, F) into (P, dst_cols)
    nl.store(out, value=small)
    return out


def test_assignment_destination_same_shape_passes(rng):
    x = rng.standard_normal((128, 16)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(assign_k, x, dst_cols=16), x)


def test_assignment_destination_smaller_than_value_fails(rng, rejects):
    x = rng.standard_normal((128, 16)).astype(np.float32)
    # documented: "Illegal assignment destination shape in 'a = b': shape [128, 1] of parameter
    # 'a' is smaller than other parameter shapes b[128, 512]."
    with rejects(Exception, match=r"(?i)destination shape|smaller"):
        nki.simulate_kernel(assign_k, x, dst_cols=1)


@nki.jit
def store_shape_k(x, *, dst_cols):
    out = nl.ndarray((x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    zero = nl.zeros(x.shape, dtype=x.dtype)
    nl.store(out, value=zero)
    nl.store(out[:, 0:dst_cols], value=nl.load(x))
    return out


def test_store_into_smaller_destination_fails(rng, rejects):
    x = rng.standard_normal((128, 16)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(store_shape_k, x, dst_cols=16), x)
    with rejects(Exception, match=r"(?i)shape|smaller"):
        nki.simulate_kernel(store_shape_k, x, dst_cols=8)


# --------------------------------------------------------------------------- PSUM assign vs +=
@nki.jit
def psum_assign_then_accumulate_k(a, b, c):
    """acc = a.T @ b (assignment), then acc += a.T @ c, then acc[:, 0:8] += a.T @ b[:, 0:8]."""
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    ta = nl.load(a)
    tb = nl.load(b)
    tc = nl.load(c)
    acc = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    acc[...] = nl.matmul(ta, tb, transpose_x=True)
    acc += nl.matmul(ta, tc, transpose_x=True)
    acc[:, 0:8] += nisa.nc_matmul(ta, tb[:, 0:8])
    nl.store(out, value=nl.copy(acc))
    return out


def test_psum_assignment_overwrites_and_plus_equals_accumulates(rng):
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((64, 24)).astype(np.float32)
    c = rng.standard_normal((64, 24)).astype(np.float32)
    out = nki.simulate_kernel(psum_assign_then_accumulate_k, a, b, c)
    a64 = a.astype(np.float64)
    ref = a64.T @ b + a64.T @ c
    ref[:, :8] += a64.T @ b[:, :8]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- affine_range: no false positives
@nki.jit
def inplace_slices_k(x):
    """Each affine_range iteration reads and rewrites only its own 32-column slice."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    buf = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    buf[...] = nl.load(x)
    for i in nl.affine_range(x.shape[1] // 32):
        buf[:, nl.ds(i * 32, 32)] = nl.exp(buf[:, nl.ds(i * 32, 32)])
    for j in nl.affine_range(2):                  # disjoint halves of the partitions
        buf[nl.ds(j * 64, 64), 0:32] = nl.multiply(buf[nl.ds(j * 64, 64), 0:32], 2.0)
    nl.store(out, value=buf)
    return out


def test_affine_range_disjoint_in_place_updates_pass(rng):
    x = rng.standard_normal((128, 96)).astype(np.float32)
    out = nki.simulate_kernel(inplace_slices_k, x)
    ref = np.exp(x.astype(np.float64))
    ref[:, :32] *= 2
    np.testing.assert_allclose(out, ref, rtol=1e-6)


@nki.jit
def nested_matmul_k(lhs_t, rhs):
    """Two nested affine_ranges accumulating into one PSUM tile per outer iteration."""
    n_out = rhs.shape[1] // 128
    out = nl.ndarray((lhs_t.shape[1], rhs.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    for n in nl.affine_range(n_out):
        acc = nl.zeros((lhs_t.shape[1], 128), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(lhs_t.shape[0] // 128):
            acc += nl.matmul(nl.load(lhs_t[nl.ds(k * 128, 128), :]),
                             nl.load(rhs[nl.ds(k * 128, 128), nl.ds(n * 128, 128)]), transpose_x=True)
        nl.store(out[:, nl.ds(n * 128, 128)], value=nl.copy(acc))
    return out


def test_affine_range_psum_accumulation_in_nested_loops(rng):
    lhs_t = rng.standard_normal((256, 64)).astype(np.float32)
    rhs = rng.standard_normal((256, 256)).astype(np.float32)
    out = nki.simulate_kernel(nested_matmul_k, lhs_t, rhs)
    np.testing.assert_allclose(out, lhs_t.astype(np.float64).T @ rhs, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- index forms
@nki.jit
def index_forms_k(x):
    """Returns (x loaded and stored through nl.mgrid indices, the even columns of x read
    from the SBUF tile with a stride-2 free-axis index)."""
    p_dim, f_dim = x.shape
    o_mgrid = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    o_even = nl.ndarray((p_dim, f_dim // 2), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:p_dim, 0:f_dim]
    tile = nl.load(x[i_p, i_f])
    nl.store(o_mgrid[i_p, i_f], value=tile)
    g = nl.mgrid[0:p_dim, 0:f_dim // 2]
    nl.store(o_even, value=nl.copy(tile[g.p, 2 * g.x]))
    return o_mgrid, o_even


def test_mgrid_and_strided_free_axis_read(rng):
    x = rng.standard_normal((96, 40)).astype(np.float32)
    full, even = nki.simulate_kernel(index_forms_k, x)
    np.testing.assert_array_equal(full, x)
    np.testing.assert_array_equal(even, x[:, 0::2])


@nki.jit
def program_id_iota_k(template):
    """VLLM pattern: the head id (program_id(1)) materialised by nisa.iota as a (1, 1) tile,
    broadcast along the free axis and stored in row head_id."""
    out = nl.ndarray(template.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    head = nl.program_id(1)
    hid = nisa.iota(head, dtype=nl.int32).reshape((1, 1))
    nl.store(out[nl.ds(head, 1), :], value=hid.broadcast_to((1, template.shape[1])))
    return out


def test_iota_of_a_program_id(rng):
    out = nki.simulate_kernel(program_id_iota_k[1, 4], np.zeros((4, 6), np.int32))
    np.testing.assert_array_equal(out, np.repeat(np.arange(4)[:, None], 6, axis=1))


# --------------------------------------------------------------------------- integer exactness
@nki.jit
def int_exact_k(a, b):
    """Returns (nisa.tensor_tensor int32 add, iota values up to 2**27, int32 transpose)."""
    o_add = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    o_iota = nl.ndarray((128, 64), dtype=nl.int32, buffer=nl.shared_hbm)
    o_tr = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.int32, buffer=nl.shared_hbm)
    ta = nl.load(a)
    tb = nl.load(b)
    nl.store(o_add, value=nisa.tensor_tensor(ta, tb, op=np.add, dtype=nl.int32))
    big = nisa.iota(nl.arange(128)[:, None] * (1 << 20) + nl.arange(64)[None, :], dtype=nl.int32)
    nl.store(o_iota, value=big)
    tr = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.int32, buffer=nl.sbuf)
    tr[...] = nl.transpose(tb)                  # b < 2**20
    nl.store(o_tr, value=tr)
    return o_add, o_iota, o_tr


def test_int32_exactness_beyond_fp32_mantissa(rng):
    # 32-bit integer add on nisa.tensor_tensor runs on GpSimd (exact); iota is int32 math;
    # nl.transpose of int32 values below 2**24 is exact even through fp32.
    a = rng.integers(2**28, 2**30, size=(64, 32)).astype(np.int32) | 1
    b = rng.integers(0, 2**20, size=(64, 32)).astype(np.int32)
    o_add, o_iota, o_tr = nki.simulate_kernel(int_exact_k, a, b)
    np.testing.assert_array_equal(o_add, a.astype(np.int64) + b)
    np.testing.assert_array_equal(o_iota, np.arange(128)[:, None] * (1 << 20) + np.arange(64)[None, :])
    np.testing.assert_array_equal(o_tr, b.T)


# --------------------------------------------------------------------------- dma_copy rmw + skip
@nki.jit
def rmw_k(base: nt.mutable_tensor, src, idx, *, skip):
    n_idx, width = src.shape
    i_p = nl.arange(n_idx)[:, None]
    i_f = nl.arange(width)[None, :]
    tile = nl.load(src)
    idx_tile = nl.load(idx)
    mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
    nisa.dma_copy(dst=base[idx_tile[i_p, 0], i_f], src=tile[i_p, i_f], dst_rmw_op=np.add,
                  oob_mode=mode)
    return base


def test_dma_copy_rmw_requires_oob_error_mode(rng, rejects):
    base = rng.standard_normal((64, 8)).astype(np.float32)
    src = rng.standard_normal((32, 8)).astype(np.float32)
    idx = rng.permutation(64)[:32].reshape(32, 1).astype(np.int32)
    ref = base.copy()
    ref[idx[:, 0]] += src
    np.testing.assert_allclose(nki.simulate_kernel(rmw_k, base.copy(), src, idx, skip=False), ref,
                               rtol=1e-6)
    # documented: "If dst_rmw_op is specified, only oob_mode=oob_mode.error is allowed."
    with rejects(Exception, match=r"(?i)oob|dst_rmw_op"):
        nki.simulate_kernel(rmw_k, base.copy(), src, idx, skip=True)


# --------------------------------------------------------------------------- bool results
@nki.jit
def default_bool_k(a, b):
    out = nl.ndarray(a.shape, dtype=nl.bool_, buffer=nl.shared_hbm)
    res = nl.greater(nl.load(a), nl.load(b))
    assert res.dtype == np.dtype(np.bool_), res.dtype
    nl.store(out, value=res)
    return out


def test_comparison_default_dtype_is_bool(rng):
    a = rng.standard_normal((32, 16)).astype(np.float32)
    b = rng.standard_normal((32, 16)).astype(np.float32)
    out = nki.simulate_kernel(default_bool_k, a, b)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, a > b)


@nki.jit
def int_pe_transpose_k(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((x.shape[1], x.shape[0]), dtype=nl.int32, buffer=nl.psum)
    t[...] = nisa.nc_transpose(nl.load(x))
    nl.store(out, value=nl.copy(t))
    return out


def test_int32_through_tensor_engine_warns_at_2_pow_24(sim_only, recwarn):
    # TensorE computes through fp32: int32 values >= 2**24 are not exact on hardware; the
    # simulator computes exactly and warns (API notes section 9 item 4, section 5.2)
    small = np.arange(-5, 5, dtype=np.int32).reshape(10, 1) * (2**21)     # |v| < 2**24
    np.testing.assert_array_equal(nki.simulate_kernel(int_pe_transpose_k, small), small.T)
    assert not [w for w in recwarn if "2^24" in str(w.message)]
    big = np.array([[2**24 + 1], [7]], np.int32)
    with pytest.warns(RuntimeWarning, match=r"2\^24"):
        nki.simulate_kernel(int_pe_transpose_k, big)
