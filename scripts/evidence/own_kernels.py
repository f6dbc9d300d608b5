"""The project's own equivalents of published measurements whose kernel is described, not published.

``dependent_scalar_chain`` -- AWS's performance guide (Opt #5a) profiles back-to-back ScalarE
``activation`` (identity) instructions that each read ONE element per partition and depend
(read after write) on the previous one; it reads an initiation interval of about 189 ns
(264 ScalarE cycles on NeuronCore-v2). This kernel issues ``instructions`` such activations on a
[128, 1] fp32 tile, each consuming the previous one's result, and stores the last one.

Legacy NKI, imported through ``nki_sim.install()`` (the runner installs it before building).
"""
from __future__ import annotations

import numpy as np

from .builders import Run, rel_err


def _kernels():
    import neuronxcc.nki as nki
    import neuronxcc.nki.isa as nisa
    import neuronxcc.nki.language as nl

    @nki.jit
    def dependent_scalar_chain(x, n_instructions):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        for _ in range(n_instructions):
            t = nisa.activation(op=nl.copy, data=t)      # RAW on the previous result
        nl.store(out, value=t)
        return out

    return {"dependent_scalar_chain": dependent_scalar_chain}


def kernel(name: str):
    """The named own kernel (a ``nki.jit`` function)."""
    kernels = _kernels()
    if name not in kernels:
        raise ValueError(f"own kernel must be one of {sorted(kernels)}; got {name!r}")
    return kernels[name]


def build(spec: dict) -> Run:
    n = int(spec["instructions"])
    if n < 1:
        raise ValueError(f"instructions must be >= 1; got {n}")
    x = np.random.default_rng(0).standard_normal((128, 1), dtype=np.float32)
    return Run((x, n), lambda out: rel_err(out, x))
