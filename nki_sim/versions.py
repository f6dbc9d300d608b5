"""Release numbers of the simulated toolchain (no dependencies; parsed by ``config``).

Legacy NKI lives in Neuron SDK 2.21 (the project's floor) to 2.27 (the last release that
ships the ``neuronxcc.nki`` namespace); ``nki_sim.config.sdk`` is one of them, as
``(major, minor)``.
"""

from __future__ import annotations

MIN_SDK, MAX_SDK = (2, 21), (2, 27)     # 2.27: last release with the legacy namespace


def parse(v) -> tuple:
    """(major, minor) from "2.24", 2.24 or (2, 24); ValueError outside 2.21-2.26."""
    if isinstance(v, str):
        parts = v.strip().split(".")
    elif isinstance(v, float):
        parts = f"{v:.2f}".split(".")
    else:
        parts = list(v)
    try:
        t = (int(parts[0]), int(parts[1]))
    except (ValueError, IndexError, TypeError):
        raise ValueError(f"sdk must look like '2.24' or (2, 24); got {v!r}") from None
    if not MIN_SDK <= t <= MAX_SDK:
        raise ValueError(f"sdk must be a legacy-NKI Neuron SDK release between 2.21 and 2.27; got {v!r}")
    return t


def fmt(t) -> str:
    return f"{t[0]}.{t[1]}"
