"""Fixtures for the black-box legacy-NKI API tests (tests/sim/test_api_*.py).

The tests use only the public legacy API (``neuronxcc.nki``, ``.language``, ``.isa``,
``.typing``), installed by ``nki_sim.install()`` when the real toolchain is absent, so the
same tests also run against the real ``neuronx-cc`` simulator. Tests that need simulator
internals (the event trace, the target switch, UninitializedReadError, "not emulated")
request the ``sim_only`` fixture, which skips them on a real install.

Kernel files under ``tests/sim/kernels/`` are written for real NKI (``import neuronxcc.nki
as nki`` at their top, no project imports); ``load_kernels(name)`` imports one by path
after ``nki_sim.install()``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import sys

import pytest

import nki_sim

nki_sim.install()
SIMULATED = nki_sim.is_installed()

KERNEL_DIR = pathlib.Path(__file__).parent / "kernels"


def load_kernels(name: str):
    """Import ``tests/sim/kernels/<name>.py`` (once) under a unique module name."""
    modname = f"_nki_api_kernels_{name}"
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, KERNEL_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tutorial():
    """The tutorial-style kernel file (SPMD add, matmul, transpose, softmax, iota, bf16)."""
    return load_kernels("tutorial_kernels")


@pytest.fixture(scope="session")
def indirect():
    """The indirect-DMA / masked-load kernel file."""
    return load_kernels("indirect_kernels")


@pytest.fixture(scope="session")
def helper_ops():
    """A helper module a kernel calls (the trace's call-site attribution)."""
    return load_kernels("helper_ops")


@pytest.fixture
def sim_only():
    """Skip unless the kernels run on nki_sim (trace, targets, simulator-only errors)."""
    if not SIMULATED:
        pytest.skip("needs nki_sim internals (trace / target switch / simulator errors)")


@pytest.fixture
def target(sim_only):
    """Context-manager factory selecting a simulated target: ``with target("trn1"): ...``."""
    return nki_sim.use_target


@pytest.fixture
def rejects():
    """``with rejects(ExcType, match=...):`` -- pytest.raises that, on nki_sim, also checks the
    error was raised by the simulator (an nki_sim.errors.NkiSimError, or raised from a frame
    inside nki_sim/), not by NumPy or by the test's own host code."""

    @contextlib.contextmanager
    def _rejects(exc=Exception, match=None):
        with pytest.raises(exc, match=match) as info:
            yield info
        if os.environ.get("NKI_API_SHOW_ERRORS"):
            print(f"\n[rejects] {type(info.value).__name__}: {info.value}")
        if SIMULATED:
            import nki_sim.errors

            origin = str(info.traceback[-1].path)
            from_sim = f"{os.sep}nki_sim{os.sep}" in origin
            assert isinstance(info.value, nki_sim.errors.NkiSimError) or from_sim, (
                f"{type(info.value).__name__} raised outside the simulator at {origin}: {info.value}")

    return _rejects


@pytest.fixture(scope="session")
def attention():
    """The small causal-attention kernel file (composition of many ops)."""
    return load_kernels("attention_kernels")


@pytest.fixture(scope="session")
def aws_patterns():
    """Kernels using the constructs of AWS's legacy attention kernels (block dims, column
    views, affine_select on PSUM, outputs under a trace-time if)."""
    return load_kernels("aws_pattern_kernels")


@pytest.fixture
def sdk_2_26():
    """Simulate Neuron SDK 2.26 (it has nisa.select_reduce and nl.store from PSUM);
    a no-op on a real toolchain."""
    import nki_sim
    if nki_sim.is_installed():
        with nki_sim.configure(sdk="2.26"):
            yield
    else:
        yield
