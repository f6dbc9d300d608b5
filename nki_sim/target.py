"""Per-target hardware limits (one frozen object per NeuronCore generation).

Selection order: ``use_target(...)`` / ``nki.jit(platform_target=...)`` (innermost wins;
per thread), then the environment variable ``NEURON_PLATFORM_TARGET_OVERRIDE``
(trn1|gen2|trn2|gen3; process-wide), then the default, trn2.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from .state import state


@dataclass(frozen=True)
class Target:
    name: str                       # "trn1" | "trn2"
    nc_version: str                 # "gen2" | "gen3"
    pmax: int = 128                 # partitions of SBUF / PSUM
    psum_fmax: int = 512            # fp32 elements per PSUM bank per partition
    gemm_stationary_fmax: int = 128
    gemm_moving_fmax: int = 512
    gemm_contraction_max: int = 128
    psum_bank_bytes: int = 2048
    psum_banks: int = 8
    psum_bytes_per_partition: int = 16384
    sbuf_bytes_per_partition: int = 196608
    sbuf_usable_bytes_per_partition: int = 180224
    transpose_max: int = 128        # TensorE transpose tile edge
    vector_transpose_max: int = 32  # VectorE transpose tile edge
    has_dma_transpose: bool = False
    has_range_select: bool = False


TARGETS: dict[str, Target] = {
    "trn1": Target(name="trn1", nc_version="gen2", sbuf_bytes_per_partition=196608,
                   sbuf_usable_bytes_per_partition=180224),
    "trn2": Target(name="trn2", nc_version="gen3", sbuf_bytes_per_partition=229376,
                   sbuf_usable_bytes_per_partition=212984, has_dma_transpose=True,
                   has_range_select=True),
}

_ALIASES = {"trn1": "trn1", "gen2": "trn1", "inf2": "trn1", "trn2": "trn2", "gen3": "trn2"}
DEFAULT_TARGET = "trn2"


def resolve_target(name) -> Target:
    """Target for a name or alias (trn1/gen2/inf2, trn2/gen3) or a Target instance."""
    if isinstance(name, Target):
        return name
    key = str(name).strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"platform_target must be one of {sorted(_ALIASES)}; got {name!r}")
    return TARGETS[_ALIASES[key]]


def get_target() -> Target:
    """The active target of the calling thread (innermost use_target, else the running
    kernel's, else env override, else trn2)."""
    s = state
    if s.targets:
        return s.targets[-1]
    k = s.kernel
    if k is not None and k.target is not None:
        return k.target
    env = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "").strip()
    if env:
        if env.lower() not in _ALIASES:
            raise ValueError(f"NEURON_PLATFORM_TARGET_OVERRIDE must be one of {sorted(_ALIASES)} "
                             f"(nki_sim simulates trn1 / trn2 only); got {env!r}")
        return resolve_target(env)
    return TARGETS[DEFAULT_TARGET]


@contextlib.contextmanager
def use_target(name):
    """Context manager selecting the simulated target (for the calling thread)."""
    stack = state.targets
    t = resolve_target(name)
    stack.append(t)
    try:
        yield t
    finally:
        stack.pop()
