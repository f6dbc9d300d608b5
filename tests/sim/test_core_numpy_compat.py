"""NumPy compatibility of the simulator: no deprecated NumPy API in nki_sim, and the suite's
warning filter (pyproject.toml) turns a DeprecationWarning from the project's own modules
into an error while leaving third-party deprecations as warnings."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl

pytestmark = pytest.mark.simulation


@nki.jit
def reshape_k(x, *, cols):
    """Tile (P, F) reshaped to (P, F // cols, cols) in SBUF and back, a view of the same memory."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    v = t.reshape((x.shape[0], x.shape[1] // cols, cols))
    assert tuple(v.shape) == (x.shape[0], x.shape[1] // cols, cols)
    v[:, 0, :] = 0.0                         # written through the reshaped view
    nl.store(out, value=v.reshape((x.shape[0], x.shape[1])))
    return out


@nki.jit
def strided_reshape_k(x):
    out = nl.ndarray((x.shape[0] * x.shape[1] // 2, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    half = t[:, 0:x.shape[1] // 2]           # the left half of each row: merging the axes copies
    nl.store(out, value=half.reshape((x.shape[0] * x.shape[1] // 2, 1)))
    return out


def test_reshape_is_a_view_without_deprecated_numpy(rng):
    x = rng.standard_normal((16, 12)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        out = nki.simulate_kernel(reshape_k, x, cols=4)
    ref = x.copy()
    ref[:, 0:4] = 0.0
    np.testing.assert_array_equal(out, ref)


def test_reshape_that_needs_a_copy_is_rejected(rng, sim_only):
    x = rng.standard_normal((16, 12)).astype(np.float32)
    with pytest.raises(ValueError, match="needs a copy"):
        nki.simulate_kernel(strided_reshape_k, x)


def test_deprecation_warnings_of_project_modules_are_errors():
    for module in ("nki_sim.tensor", "nki_kernels.dense.flash_core", "host.attention"):
        with pytest.raises(DeprecationWarning):
            warnings.warn_explicit("planted", DeprecationWarning, "x.py", 1, module=module)


def test_deprecation_warnings_of_other_modules_stay_warnings():
    for module in ("numpy._core", "nki_simulator_elsewhere", "hostile"):
        with pytest.warns(DeprecationWarning, match="planted"):
            warnings.warn_explicit("planted", DeprecationWarning, "x.py", 1, module=module)
