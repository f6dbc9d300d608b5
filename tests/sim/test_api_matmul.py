"""Matmul / transpose ops and their hardware checks (tile sizes, PSUM bank, operand
memories), and the affine_range loop-carried-dependency checker. Each check has a
must-pass twin that differs only in the violating detail."""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation


@nki.jit
def nc_matmul_once(stationary, moving):
    """out (M, N) = stationary.T @ moving; stationary (K, M), moving (K, N) loaded whole."""
    out = nl.ndarray((stationary.shape[1], moving.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    res = nisa.nc_matmul(nl.load(stationary), nl.load(moving))
    nl.store(out, value=nl.copy(res))
    return out


@pytest.mark.parametrize("k,m,n", [(128, 128, 512), (32, 7, 1), (1, 128, 3)])
def test_nc_matmul_within_limits(rng, k, m, n):
    s = rng.standard_normal((k, m)).astype(np.float32)
    mv = rng.standard_normal((k, n)).astype(np.float32)
    out = nki.simulate_kernel(nc_matmul_once, s, mv)
    np.testing.assert_allclose(out, s.astype(np.float64).T @ mv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k,m,n,what", [(128, 256, 512, r"stationary|128"),
                                        (128, 128, 1024, r"moving|512")],
                         ids=["stationary-free-256", "moving-free-1024"])
def test_nc_matmul_free_size_limits(rng, k, m, n, what, rejects):
    s = rng.standard_normal((k, m)).astype(np.float32)
    mv = rng.standard_normal((k, n)).astype(np.float32)
    with rejects(Exception, match=rf"(?i){what}"):
        nki.simulate_kernel(nc_matmul_once, s, mv)


def test_nc_matmul_contraction_mismatch(rng, rejects):
    s = rng.standard_normal((128, 64)).astype(np.float32)
    mv = rng.standard_normal((96, 64)).astype(np.float32)
    with rejects(Exception, match=r"(?i)contraction|partition|mismatch|shape"):
        nki.simulate_kernel(nc_matmul_once, s, mv)


@nki.jit
def matmul_from_psum(x, y):
    """nl.matmul whose x operand sits in PSUM (TensorE reads only SBUF)."""
    out = nl.ndarray((x.shape[1], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    x_sb = nl.load(x)
    x_ps = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
    x_ps[...] = nl.copy(x_sb)
    res = nl.matmul(x_ps, nl.load(y), transpose_x=True)
    nl.store(out, value=nl.copy(res))
    return out


@nki.jit
def matmul_from_sbuf(x, y):
    out = nl.ndarray((x.shape[1], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    x_sb = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    x_sb[...] = nl.copy(nl.load(x))
    res = nl.matmul(x_sb, nl.load(y), transpose_x=True)
    nl.store(out, value=nl.copy(res))
    return out


def test_tensor_engine_operands_in_sbuf_pass_psum_fail(rng, rejects):
    x = rng.standard_normal((64, 32)).astype(np.float32)
    y = rng.standard_normal((64, 48)).astype(np.float32)
    out = nki.simulate_kernel(matmul_from_sbuf, x, y)
    np.testing.assert_allclose(out, x.astype(np.float64).T @ y, rtol=1e-4, atol=1e-4)
    with rejects(Exception, match=r"(?i)psum|sbuf|memory|address space"):
        nki.simulate_kernel(matmul_from_psum, x, y)


@nki.jit
def psum_tile(a, *, free, dtype):
    """Allocate a (128, free) PSUM tile of ``dtype``, fill it from a and store it."""
    out = nl.ndarray((128, free), dtype=dtype, buffer=nl.shared_hbm)
    acc = nl.zeros((128, free), dtype=dtype, buffer=nl.psum)
    acc[...] = nl.load(a)
    nl.store(out, value=nl.copy(acc))
    return out


@pytest.mark.parametrize("free,dtype", [(512, np.float32), (1024, np.float16)])
def test_psum_tile_within_one_bank(rng, free, dtype):
    a = rng.standard_normal((128, free)).astype(dtype)
    np.testing.assert_array_equal(nki.simulate_kernel(psum_tile, a, free=free, dtype=dtype), a)


@pytest.mark.parametrize("free,dtype", [(1024, np.float32), (513, np.float32), (1040, np.float16)])
def test_psum_tile_larger_than_2kib_fails(rng, free, dtype, rejects):
    a = rng.standard_normal((128, free)).astype(dtype)
    with rejects(Exception, match=r"(?i)psum|2048|2 ?kib|bank"):
        nki.simulate_kernel(psum_tile, a, free=free, dtype=dtype)


# --------------------------------------------------------------------------- transposes
@nki.jit
def nl_transpose(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    res = nl.transpose(nl.load(x))          # the size check fires here, before any allocation
    nl.store(out, value=nl.copy(res))
    return out


def test_nl_transpose_128x128_passes(rng):
    x = rng.standard_normal((128, 128)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(nl_transpose, x), x.T)


def test_nl_transpose_dimension_over_128_fails(rng, rejects):
    x = rng.standard_normal((128, 512)).astype(np.float32)
    # documented: "size of dimension 1 in 'x[128, 512]' of 'transpose' exceed architecture
    # limitation of 128"
    with rejects(Exception, match=r"(?i)size of dimension 1 in 'x\[128, 512\]' of 'transpose' "
                                  r"exceed architecture limitation of 128"):
        nki.simulate_kernel(nl_transpose, x)


@nki.jit
def nc_transpose_engine(x, *, engine_name, from_psum):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    if from_psum:
        src = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        src[...] = nl.copy(tile)
    else:
        src = tile
    res = nisa.nc_transpose(src, engine=getattr(nisa, engine_name))
    nl.store(out, value=nl.copy(res, dtype=nl.float32))
    return out


@pytest.mark.parametrize("shape,engine", [((128, 128), "tensor_engine"), ((32, 32), "vector_engine"),
                                          ((17, 5), "vector_engine")])
def test_nc_transpose_within_engine_limits(rng, shape, engine):
    x = rng.standard_normal(shape).astype(np.float32)
    out = nki.simulate_kernel(nc_transpose_engine, x, engine_name=engine, from_psum=False)
    np.testing.assert_array_equal(out, x.T)


def test_nc_transpose_vector_engine_over_32_fails(rng, rejects):
    x = rng.standard_normal((64, 64)).astype(np.float32)
    with rejects(Exception, match=r"(?i)32|vector"):
        nki.simulate_kernel(nc_transpose_engine, x, engine_name="vector_engine", from_psum=False)


def test_nc_transpose_tensor_engine_from_psum_fails_vector_engine_passes(rng, rejects):
    x = rng.standard_normal((32, 32)).astype(np.float32)
    out = nki.simulate_kernel(nc_transpose_engine, x, engine_name="vector_engine", from_psum=True)
    np.testing.assert_array_equal(out, x.T)
    with rejects(Exception, match=r"(?i)psum|sbuf|memory|address space"):
        nki.simulate_kernel(nc_transpose_engine, x, engine_name="tensor_engine", from_psum=True)


# NeuronCore-v2's PE transpose is a matmul of the data with an identity, "not bit-accurate if the
# input data contains NaN/Inf" (nki.isa.nc_transpose reference): x * 0 = NaN for x = NaN or +-Inf
# reaches every element of the non-finite element's output row. NeuronCore-v3 on, and VectorE
# transposes, are bit-accurate.
@pytest.mark.parametrize("tgt", ["trn1", "trn2"])
def test_pe_transpose_of_finite_data_is_exact_on_both_generations(rng, target, tgt):
    x = rng.standard_normal((128, 96)).astype(np.float32)
    x[3, 7] = np.finfo(np.float32).max
    with target(tgt):
        out = nki.simulate_kernel(nc_transpose_engine, x, engine_name="tensor_engine",
                                  from_psum=False)
    assert out.tobytes() == np.ascontiguousarray(x.T).tobytes()


@pytest.mark.parametrize("engine,tgt", [("tensor_engine", "trn2"), ("vector_engine", "trn1")])
def test_nan_and_inf_transpose_bit_accurately_on_gen3_and_on_vector_engine(rng, target, engine,
                                                                           tgt):
    x = rng.standard_normal((32, 24)).astype(np.float32)
    x[5, 2], x[9, 11] = np.nan, np.inf
    with target(tgt):
        out = nki.simulate_kernel(nc_transpose_engine, x, engine_name=engine, from_psum=False)
    np.testing.assert_array_equal(out, x.T)      # NaN where x.T has NaN, nowhere else


def test_gen2_pe_transpose_spreads_nan_and_inf_along_their_output_rows(rng, target):
    x = rng.standard_normal((32, 24)).astype(np.float32)
    x[5, 2] = np.nan                   # output row 2: NaN everywhere
    x[9, 11] = np.inf                  # output row 11: Inf stays in place, NaN elsewhere
    x[4, 20] = x[6, 20] = -np.inf      # two in one column: every element of row 20 NaN
    with target("trn1"):
        out = nki.simulate_kernel(nc_transpose_engine, x, engine_name="tensor_engine",
                                  from_psum=False)
    assert np.isnan(out[2]).all() and np.isnan(out[20]).all()
    assert out[11, 9] == np.inf and np.isnan(np.delete(out[11], 9)).all()
    clean = np.delete(np.arange(24), [2, 11, 20])
    assert out[clean].tobytes() == np.ascontiguousarray(x.T[clean]).tobytes()


# --------------------------------------------------------------------------- affine_range checker
@nki.jit
def accumulate_rows(x, *, loop):
    """Sum of the (128, F) row blocks of x (n*128, F) into one SBUF accumulator."""
    width = x.shape[1]
    out = nl.ndarray((128, width), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((128, width), dtype=nl.float32)
    for i in getattr(nl, loop)(x.shape[0] // 128):
        tile = nl.load(x[nl.ds(i * 128, 128), 0:width])
        acc[...] = nl.add(acc, tile)          # loop-carried through acc
    nl.store(out, value=acc)
    return out


@pytest.mark.parametrize("loop", ["sequential_range", "static_range"])
def test_sequential_range_allows_loop_carried_dependency(rng, loop):
    x = rng.standard_normal((384, 16)).astype(np.float32)
    out = nki.simulate_kernel(accumulate_rows, x, loop=loop)
    np.testing.assert_allclose(out, x.reshape(3, 128, 16).astype(np.float64).sum(0), atol=1e-5)


def test_affine_range_loop_carried_dependency_is_rejected(rng, rejects):
    x = rng.standard_normal((384, 16)).astype(np.float32)
    with rejects(SyntaxError, match="Unexpected output dependencies"):
        nki.simulate_kernel(accumulate_rows, x, loop="affine_range")


@nki.jit
def store_blocks(x, *, same_dst):
    """Copy the 128-row blocks of x; with same_dst every iteration writes rows 0..127."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        tile = nl.load(x[nl.ds(i * 128, 128), :])
        row0 = 0 if same_dst else i * 128
        nl.store(out[nl.ds(row0, 128), :], value=tile)
    return out


def test_affine_range_disjoint_writes_pass(rng):
    x = rng.standard_normal((256, 8)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(store_blocks, x, same_dst=False), x)


def test_affine_range_overlapping_writes_fail(rng, rejects):
    x = rng.standard_normal((256, 8)).astype(np.float32)
    with rejects(SyntaxError, match="Unexpected output dependencies"):
        nki.simulate_kernel(store_blocks, x, same_dst=True)


@nki.jit
def shift_columns(x, *, loop):
    """buf[:, i+1] = 2 * buf[:, i]: iteration i reads what iteration i-1 wrote."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    buf = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    buf[:, 0:1] = nl.load(x[:, 0:1])
    for i in getattr(nl, loop)(x.shape[1] - 1):
        buf[:, nl.ds(i + 1, 1)] = nl.multiply(buf[:, nl.ds(i, 1)], 2.0)
    nl.store(out, value=buf)
    return out


def test_read_after_write_across_iterations_in_sequential_range(rng):
    x = rng.standard_normal((64, 6)).astype(np.float32)
    out = nki.simulate_kernel(shift_columns, x, loop="sequential_range")
    np.testing.assert_array_equal(out, x[:, :1] * (2.0 ** np.arange(6))[None, :])


def test_read_after_write_across_affine_iterations_fails(rng, sim_only, rejects):
    # the dst access contains the loop index, so the legacy compiler need not flag it ("unsafe
    # and could lead to numerical errors"); the simulator's element-level checker does
    x = rng.standard_normal((64, 6)).astype(np.float32)
    with rejects(SyntaxError, match="Unexpected output dependencies"):
        nki.simulate_kernel(shift_columns, x, loop="affine_range")
