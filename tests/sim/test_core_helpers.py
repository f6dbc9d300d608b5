"""Helpers for the sim-core internal tests (test_core_*.py): direct nki_sim modules, no install."""

from __future__ import annotations

import numpy as np

from nki_sim.legacy import isa as nisa  # noqa: F401
from nki_sim.legacy import language as nl  # noqa: F401
from nki_sim.legacy import nki_api as nki  # noqa: F401
from nki_sim.legacy import nki_typing as nt  # noqa: F401


def run(body, *args, grid=(), **kwargs):
    """Simulate ``body`` (a plain function) as a kernel; returns its NumPy outputs."""
    k = nki.jit(body)
    return nki.simulate_kernel(k[grid] if grid else k, *args, **kwargs)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)
