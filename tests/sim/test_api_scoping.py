"""Kernel-structure rules of the legacy tracer that an eager simulator could silently accept:
where shared_hbm outputs may be created, tensors used outside the loop that created them,
NumPy functions applied to tiles, and grid-launched kernels nested in kernels."""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation


def _make_output(shape, dtype):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)


@nki.jit
def output_top_k(x):
    """Creates the shared_hbm output at kernel level (the legal site)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x))
    return out


@nki.jit
def output_in_if_k(x):
    """Creates the shared_hbm output inside an if on the program id (the catalogue's example)."""
    if nl.program_id(0) >= 0:
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x))
    return out


@nki.jit
def output_in_helper_k(x):
    """Creates the shared_hbm output in a helper function."""
    out = _make_output(x.shape, x.dtype)
    nl.store(out, value=nl.load(x))
    return out


def test_shared_hbm_output_at_kernel_level_passes(rng):
    x = rng.standard_normal((16, 4)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(output_top_k, x), x)


@pytest.mark.parametrize("kernel", [output_in_if_k, output_in_helper_k], ids=["if", "helper"])
def test_shared_hbm_output_outside_kernel_level_fails(rng, kernel, rejects):
    # err_shared_hbm_must_in_kernel_level: shared_hbm tensors only at top-level kernel scope
    x = rng.standard_normal((16, 4)).astype(np.float32)
    with rejects(Exception, match=r"(?i)shared_hbm|kernel level|top.level"):
        nki.simulate_kernel(kernel, x)


@nki.jit
def loop_scope_k(x, *, inside):
    """Sums the 128-row blocks of x into `acc`, created before the loop or inside its body,
    and stores `acc` after the loop."""
    out = nl.ndarray((128, x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    if not inside:
        acc = nl.zeros((128, x.shape[1]), dtype=nl.float32)
    for i in nl.sequential_range(x.shape[0] // 128):
        if inside:
            acc = nl.zeros((128, x.shape[1]), dtype=nl.float32)
        acc[...] = nl.add(acc, nl.load(x[nl.ds(i * 128, 128), :]))
    nl.store(out, value=acc)                  # used after the loop
    return out


def test_tensor_created_before_the_loop_is_usable_after_it(rng):
    x = rng.standard_normal((256, 4)).astype(np.float32)
    out = nki.simulate_kernel(loop_scope_k, x, inside=False)
    np.testing.assert_allclose(out, x[:128] + x[128:], rtol=1e-6)


def test_tensor_created_in_a_loop_body_used_after_the_loop_fails(rng, rejects):
    # err_local_variable_used_out_of_scope: tensors created inside a loop (or if) body
    # cannot be used outside it
    x = rng.standard_normal((256, 4)).astype(np.float32)
    with rejects(Exception, match=r"(?i)scope|outside"):
        nki.simulate_kernel(loop_scope_k, x, inside=True)


@nki.jit
def numpy_on_tile_k(x, *, use_numpy):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    res = np.exp(tile) if use_numpy else nl.exp(tile)   # tiles are not NumPy arrays on device
    nl.store(out, value=res)
    return out


def test_numpy_function_on_a_tile_fails(rng):
    # NumPy itself raises (tiles refuse ufuncs), so the error is not from a simulator frame
    x = rng.standard_normal((16, 4)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(numpy_on_tile_k, x, use_numpy=False),
                               np.exp(x.astype(np.float64)), rtol=1e-6)
    with pytest.raises(TypeError):
        nki.simulate_kernel(numpy_on_tile_k, x, use_numpy=True)


@nki.jit
def inner_k(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x))
    return out


@nki.jit
def outer_k(x):
    return inner_k[2](x)                     # a grid launch inside a kernel


def test_grid_launch_nested_in_a_kernel_fails(rng, rejects):
    # err_nested_kernel_with_spmd_grid
    x = rng.standard_normal((16, 4)).astype(np.float32)
    with rejects(Exception, match=r"(?i)nested|grid"):
        nki.simulate_kernel(outer_k, x)
