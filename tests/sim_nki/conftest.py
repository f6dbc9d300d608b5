"""Fixtures of the current-API (``import nki``) simulator tests (helpers: sim_nki_util.py).

``nki_sim.install()`` registers ``nki`` / ``nki.language`` / ``nki.isa`` when the real package is
absent.
"""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim

nki_sim.install()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
