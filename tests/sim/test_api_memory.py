"""Creation APIs, tensor methods, data movement (load / store / copy), memory checks
(partition limit, load source, block dimensions, basic/advanced index mixing),
immutable inputs and uninitialized reads."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt

pytestmark = pytest.mark.simulation


# --------------------------------------------------------------------------- creation APIs
@nki.jit
def creation_k(x):
    """Returns (zeros, ones, full(2.5), zeros_like(x), empty_like(x) filled with x + 1) as fp32
    plus an int32 zeros, all of x's (P, F) shape."""
    p_dim, f_dim = x.shape
    o_zeros = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    o_ones = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    o_full = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    o_zl = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    o_el = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    o_int = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    nl.store(o_zeros, value=nl.zeros((p_dim, f_dim), dtype=nl.float32))
    nl.store(o_ones, value=nl.ones((nl.par_dim(p_dim), f_dim), dtype=nl.float32, buffer=nl.sbuf))
    nl.store(o_full, value=nl.full((p_dim, f_dim), 2.5, dtype=nl.float32))
    zl = nl.zeros_like(tile)
    assert zl.shape == tile.shape and zl.dtype == tile.dtype
    nl.store(o_zl, value=zl)
    el = nl.empty_like(tile)
    el[...] = nl.add(tile, 1.0)
    nl.store(o_el, value=el)
    nl.store(o_int, value=nl.zeros((p_dim, f_dim), dtype=nl.int32))
    return o_zeros, o_ones, o_full, o_zl, o_el, o_int


def test_creation_apis(rng):
    x = rng.standard_normal((96, 40)).astype(np.float32)
    zeros, ones, full, zl, el, izeros = nki.simulate_kernel(creation_k, x)
    np.testing.assert_array_equal(zeros, 0)
    np.testing.assert_array_equal(ones, 1)
    np.testing.assert_array_equal(full, 2.5)
    np.testing.assert_array_equal(zl, 0)
    np.testing.assert_allclose(el, x.astype(np.float64) + 1, atol=1e-6)
    assert izeros.dtype == np.int32 and not izeros.any()


@nki.jit
def sbuf_tile_of(*, parts, use_par_dim_first):
    shape = (nl.par_dim(parts), 4) if use_par_dim_first else (2, nl.par_dim(parts), 4)
    out = nl.ndarray((parts, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.zeros(shape, dtype=nl.float32)
    nl.store(out, value=t if use_par_dim_first else t[0])
    return out


def test_sbuf_tile_with_128_partitions_passes():
    np.testing.assert_array_equal(nki.simulate_kernel(sbuf_tile_of, parts=128, use_par_dim_first=True), 0)


def test_sbuf_tile_with_256_partitions_fails(rejects):
    # documented: "number of partitions 256 exceed architecture limitation of 128." /
    # "Size of partition dimension 256 exceeds architecture limitation of 128."
    with rejects(Exception, match=r"(?i)partition.*256.*exceed.*128"):
        nki.simulate_kernel(sbuf_tile_of, parts=256, use_par_dim_first=True)


def test_block_dimension_before_partition_is_rejected(rejects, sdk_2_26):
    # block dimensions (leading dims before par_dim): deprecated in the legacy API, an error
    # with the project's strict setting
    import contextlib

    import nki_sim
    strict = nki_sim.configure(block_dims="error") if nki_sim.is_installed() else contextlib.nullcontext()
    with strict, rejects(Exception, match=r"(?i)partition|block|leading"):
        nki.simulate_kernel(sbuf_tile_of, parts=128, use_par_dim_first=False)


@nki.jit
def hbm_full_k(x, *, value):
    out = nl.full(x.shape, value, dtype=nl.float32, buffer=nl.shared_hbm)
    return out


def test_hbm_tensor_with_init_value_is_rejected(rng, rejects):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    with rejects(Exception, match=r"(?i)init|hbm"):
        nki.simulate_kernel(hbm_full_k, x, value=1.0)


# --------------------------------------------------------------------------- tensor methods
@nki.jit
def tensor_methods_k(x, col):
    """x (P, F) fp32 with F even, col (P, 1) fp32. Returns
    (x.view(int32), x.astype(bf16), col.broadcast_to((P, F)), x.reshape((P, 2, F//2)),
    x.expand_dims(2)) and checks .shape / .dtype / .ndim / .itemsize on the way."""
    p_dim, f_dim = x.shape
    o_view = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    o_astype = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    o_bcast = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    o_reshape = nl.ndarray((p_dim, 2, f_dim // 2), dtype=nl.float32, buffer=nl.shared_hbm)
    o_expand = nl.ndarray((p_dim, f_dim, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    assert tuple(tile.shape) == (p_dim, f_dim)
    assert tile.dtype == np.dtype(np.float32) and tile.ndim == 2 and tile.itemsize == 4
    nl.store(o_view, value=tile.view(nl.int32))
    nl.store(o_astype, value=tile.astype(nl.bfloat16))
    nl.store(o_bcast, value=nl.load(col).broadcast_to((p_dim, f_dim)))
    r = tile.reshape((p_dim, 2, f_dim // 2))
    assert tuple(r.shape) == (p_dim, 2, f_dim // 2)
    nl.store(o_reshape, value=r)
    e = tile.expand_dims(2)
    assert tuple(e.shape) == (p_dim, f_dim, 1)
    nl.store(o_expand, value=e)
    return o_view, o_astype, o_bcast, o_reshape, o_expand


def test_tensor_methods(rng):
    x = rng.standard_normal((64, 32)).astype(np.float32)
    col = rng.standard_normal((64, 1)).astype(np.float32)
    view, astype, bcast, reshaped, expanded = nki.simulate_kernel(tensor_methods_k, x, col)
    np.testing.assert_array_equal(view, x.view(np.int32))
    np.testing.assert_array_equal(astype.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    np.testing.assert_array_equal(bcast, np.broadcast_to(col, x.shape))
    np.testing.assert_array_equal(reshaped, x.reshape(64, 2, 16))
    np.testing.assert_array_equal(expanded, x[:, :, None])


@nki.jit
def bad_method_k(x, *, which):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    if which == "reshape":
        tile = tile.reshape((x.shape[0], x.shape[1] - 1))
    else:
        tile = tile.broadcast_to((x.shape[0], x.shape[1] * 3))
    nl.store(out, value=tile)
    return out


@pytest.mark.parametrize("which", ["reshape", "broadcast_to"])
def test_tensor_method_with_incompatible_shape_fails(rng, which, rejects):
    x = rng.standard_normal((64, 32)).astype(np.float32)
    with rejects(Exception, match=r"(?i)shape|size|broadcast|reshape"):
        nki.simulate_kernel(bad_method_k, x, which=which)


@nki.jit
def hbm_reshape_k(x):
    """x (R, C) in HBM viewed as (R*C/64, 64) and copied out (HBM reshape is a free view)."""
    flat = x.reshape((x.shape[0] * x.shape[1] // 64, 64))
    out = nl.ndarray(flat.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(flat))
    return out


def test_hbm_input_reshape(rng):
    x = rng.standard_normal((32, 128)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(hbm_reshape_k, x), x.reshape(64, 64))


# --------------------------------------------------------------------------- data movement
@nki.jit
def copy_paths_k(x):
    """load -> nl.copy -> assignment into a slice -> store, plus nl.load(src=SBUF) when asked."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    c = nl.copy(tile)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    dst[:, 0:x.shape[1] // 2] = c[:, 0:x.shape[1] // 2]
    dst[:, nl.ds(x.shape[1] // 2, x.shape[1] // 2)] = c[:, x.shape[1] // 2:]
    nl.store(out, value=dst)
    return out


def test_copy_and_slice_assignment(rng):
    x = rng.standard_normal((128, 64)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(copy_paths_k, x), x)


@nki.jit
def load_from_sbuf_k(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    again = nl.load(tile)               # load source must be HBM
    nl.store(out, value=again)
    return out


def test_load_from_sbuf_fails(rng, rejects):
    x = rng.standard_normal((128, 64)).astype(np.float32)
    # documented: "Expected operand 'src' of 'load' to be in address space 'hbm', but got a
    # tile in 'sbuf' instead."
    with rejects(Exception, match=r"(?i)hbm"):
        nki.simulate_kernel(load_from_sbuf_k, x)


@nki.jit
def load_rows_k(x, *, rows):
    out = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x[0:rows, :]))
    return out


def test_load_of_128_rows_passes_256_fails(rng, rejects):
    x = rng.standard_normal((256, 16)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(load_rows_k, x, rows=128), x[:128])
    with rejects(Exception, match=r"(?i)partition.*256.*128|256.*exceed.*128"):
        nki.simulate_kernel(load_rows_k, x, rows=256)


@nki.jit
def mixed_indexing_k(x, *, mixed):
    out = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    tile = nl.load(x[i_p, :]) if mixed else nl.load(x[i_p, i_f])
    nl.store(out, value=tile)
    return out


def test_mixing_basic_and_advanced_indexing_fails(rng, rejects):
    x = rng.standard_normal((128, 16)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(mixed_indexing_k, x, mixed=False), x)
    with rejects(Exception, match=r"(?i)mix|basic|advanced"):
        nki.simulate_kernel(mixed_indexing_k, x, mixed=True)


# --------------------------------------------------------------------------- immutability
@nki.jit
def write_input_k(x):
    nl.store(x, value=nl.multiply(nl.load(x), 2.0))
    return x


@nki.jit
def write_mutable_k(x: nt.mutable_tensor):
    nl.store(x, value=nl.multiply(nl.load(x), 2.0))
    return x


@nki.jit
def write_mutable_not_returned_k(x: nt.mutable_tensor, y):
    nl.store(x, value=nl.multiply(nl.load(x), 2.0))
    out = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(y))
    return out


def test_mutable_input_is_written_in_place(rng):
    x = rng.standard_normal((64, 16)).astype(np.float32)
    original = x.copy()
    out = nki.simulate_kernel(write_mutable_k, x)
    np.testing.assert_array_equal(out, 2 * original)
    np.testing.assert_array_equal(x, 2 * original)


def test_immutable_input_write_fails(rng, rejects):
    x = rng.standard_normal((64, 16)).astype(np.float32)
    original = x.copy()
    with rejects(Exception, match=r"(?i)immutable"):
        nki.simulate_kernel(write_input_k, x)
    np.testing.assert_array_equal(x, original)           # nothing written back


def test_mutable_parameter_not_returned_fails(rng, rejects):
    x = rng.standard_normal((64, 16)).astype(np.float32)
    with rejects(Exception, match=r"(?i)mutable.*return|not returned"):
        nki.simulate_kernel(write_mutable_not_returned_k, x, x.copy())


# --------------------------------------------------------------------------- uninitialized reads
@nki.jit
def partial_init_k(x, *, read_rows):
    """Only rows < 64 of an nl.ndarray tile are written; rows < read_rows are then read."""
    out = nl.ndarray((read_rows, x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((128, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    t[0:64, :] = nl.load(x[0:64, :])
    nl.store(out, value=nl.exp(t[0:read_rows, :]))
    return out


def test_reading_only_written_elements_passes(rng):
    x = rng.standard_normal((128, 8)).astype(np.float32)
    out = nki.simulate_kernel(partial_init_k, x, read_rows=64)
    np.testing.assert_allclose(out, np.exp(x[:64].astype(np.float64)), rtol=1e-6)


def test_uninitialized_read_is_detected(rng, sim_only, rejects):
    import nki_sim.errors

    x = rng.standard_normal((128, 8)).astype(np.float32)
    with rejects(nki_sim.errors.UninitializedReadError):
        nki.simulate_kernel(partial_init_k, x, read_rows=65)


@nki.jit
def copy_src_k(x, *, from_hbm):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.copy(x if from_hbm else nl.load(x)))
    return out


def test_nl_copy_of_a_tile_passes_of_hbm_fails(rng, rejects):
    x = rng.standard_normal((32, 8)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(copy_src_k, x, from_hbm=False), x)
    with rejects(Exception, match=r"(?i)hbm|sbuf|address space"):
        nki.simulate_kernel(copy_src_k, x, from_hbm=True)


@nki.jit
def maybe_unwritten_output_k(x, *, write):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    if write:
        nl.store(out, value=tile)
    return out


def test_output_never_written_fails(rng, rejects):
    x = rng.standard_normal((16, 4)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(maybe_unwritten_output_k, x, write=True), x)
    with rejects(Exception, match=r"(?i)not written|never written|output"):
        nki.simulate_kernel(maybe_unwritten_output_k, x, write=False)


@nki.jit
def rank_k(x, *, shape):
    out = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.zeros(shape, dtype=x.dtype)
    nl.store(out, value=nl.add(nl.load(x), t))
    return out


def test_on_chip_tiles_need_rank_two(rng, rejects):
    # known issue: nl.zeros((128,)) fails with "Insufficient rank"; use (128, 1)
    x = rng.standard_normal((128, 1)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(rank_k, x, shape=(128, 1)), x)
    with rejects(Exception, match=r"(?i)rank"):
        nki.simulate_kernel(rank_k, x, shape=(128,))
