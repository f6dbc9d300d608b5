"""Shared test configuration: options, markers, tolerances, seeded RNG."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings as _hypothesis_settings

# Every property test is seeded: hypothesis draws its examples from a fixed seed (derandomize)
# and keeps no example database, so a run is reproducible and independent of earlier runs.
_hypothesis_settings.register_profile("seeded", derandomize=True, database=None)
_hypothesis_settings.load_profile("seeded")

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# One tolerance table for every numerical comparison against the float64 reference.
# Keys: (kernel compute mode, input dtype name) -> (atol, rtol).
#   "fp32"  : mixed_precision=False, everything in the input dtype (fp32 inputs)
#   "mixed" : mixed_precision=True, bf16 matmul inputs / probabilities, fp32 statistics
TOLERANCES: dict[tuple[str, str], tuple[float, float]] = {
    ("fp32", "float32"): (1e-3, 0.0),
    ("mixed", "float32"): (3e-2, 0.0),
    ("mixed", "bfloat16"): (4e-2, 0.0),
    ("fp32", "bfloat16"): (4e-2, 0.0),
    ("fp32", "float16"): (1e-2, 0.0),
    ("mixed", "float16"): (3e-2, 0.0),
    # End to end: logits of a transformers model whose attention runs on the paged backend
    # (fp32 kernel, mixed_precision=False) vs the same model with transformers' eager attention.
    # Both are fp32 and differ only in summation order (kernel tiles and online softmax vs one
    # matmul + softmax), carried through the layers and lm_head: observed <= 7e-6 on logits of
    # magnitude ~1 over 32-40 greedy steps (tests/integration/test_hf_backend.py); 1e-4 leaves
    # a 15x margin and is still far below the gaps that decide greedy tokens.
    ("hf-logits", "float32"): (1e-4, 0.0),
}
# FP8 KV caches (float8_e4m3fn / float8_e5m2 with k_scale / v_scale) have no rows of their own:
# they use the row of the kernel mode and the QUERY dtype. The cached values ARE the fp8 values
# (the reference dequantizes exactly those bytes, k_fp8 * k_scale in float64), so fp8
# quantization is not an error of the kernel; what remains is the kernel's own compute error.
# fp8 -> bf16 / fp32 conversion is exact (3 or 2 mantissa bits, exponents inside bf16's range),
# and folding the scales (k_scale into the scaled query, v_scale into o / l) adds one rounding
# in the kernel dtype per operand -- the same relative size as the roundings of the query, the
# keys and the probabilities that the row already budgets. Test caches hold fp8(x / scale) of
# x in [-1, 1], i.e. dequantized magnitudes equal to the non-fp8 tests, for which the rows
# were set.


def tolerance(mode: str, dtype) -> tuple[float, float]:
    """(atol, rtol) for a kernel mode ("fp32" or "mixed") and an input dtype."""
    return TOLERANCES[(mode, np.dtype(dtype).name)]


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run tests marked slow (large sweeps)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow sweep; run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A fresh, seeded NumPy generator per test (seed 0)."""
    return np.random.default_rng(0)


@pytest.fixture
def tol():
    """The project tolerance table lookup ``tolerance(mode, dtype) -> (atol, rtol)``."""
    return tolerance


def _load_script(name: str):
    """scripts/<name>.py imported as a module, once per process (scripts/ is not a package)."""
    key = f"_nki_pa_script_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@pytest.fixture
def load_script():
    """``load_script("bench_block_copy")`` -> the script's module (call its ``main(argv)``)."""
    return _load_script


@pytest.fixture
def fast_switching():
    """Make the interpreter switch threads every microsecond or so, so kernels simulated in
    several threads at once interleave instruction by instruction (thread-safety tests)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)
