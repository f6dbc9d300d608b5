"""``neuronxcc.nki`` as emulated by nki_sim: jit, simulate_kernel, baremetal, benchmark, profile."""

from __future__ import annotations

from . import compiler, isa, language  # noqa: F401
from . import nki_typing as typing  # noqa: F401
from .launch import baremetal, benchmark, jit, profile, simulate_kernel  # noqa: F401
from .tensor import LegacyTensor as tensor  # noqa: F401

trace = jit
__nki_sim__ = True
