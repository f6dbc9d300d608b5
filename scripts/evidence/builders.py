"""Inputs and references of the evidence cases (``measurements.json`` field ``inputs.builder``).

Each builder returns a :class:`Run`: the kernel's positional arguments (NumPy, seeded) and a
``check(out) -> float`` giving the largest error of the kernel output relative to the largest
reference magnitude. References are float64 NumPy written from each operation's definition,
except ``nkibench``, which uses the benchmark's own NumPy reference module (fetched with the
kernel: ``get_inputs`` / ``forward`` / ``transform_*``), the reference its authors checked
the kernel against.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np

SEED = 0


@dataclass
class Run:
    args: tuple
    check: Callable[[object], float]
    kwargs: dict = field(default_factory=dict)
    tolerance: float = 2e-2          # largest |out - ref| / max|ref| accepted


def load_module(path: Path, name: str):
    """Import a fetched source file as a module of its own (never put on sys.path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rel_err(out, ref) -> float:
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"kernel output shape {out.shape} != reference shape {ref.shape}")
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(out - ref))) / scale


def nkibench(spec: dict, fetch_ref: Callable[[str], Path]) -> Run:
    ref = load_module(fetch_ref(spec["reference"]), "nkibench_ref_" + Path(spec["reference"]).stem)
    np.random.seed(SEED)             # the reference module draws with np.random
    inputs = ref.get_inputs()
    nki_inputs = tuple(ref.transform_to_nki_inputs(inputs))

    def check(out):
        expected = ref.forward(*inputs)
        outs = ref.transform_nki_outputs(out, expected)
        exp = expected if isinstance(expected, tuple) else (expected,)
        return max(rel_err(o, e) for o, e in zip(outs, exp))
    return Run(nki_inputs, check)


def matmul_tutorial(spec: dict, fetch_ref=None) -> Run:
    """lhsT [K, M] and rhs [K, N] in bf16; result [M, N] = lhsT^T @ rhs (rows sampled)."""
    k, m, n = spec["K"], spec["M"], spec["N"]
    rng = np.random.default_rng(SEED)
    lhs_t = rng.standard_normal((k, m), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((k, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rows = np.sort(rng.choice(m, size=min(m, 64), replace=False))

    def check(out):
        ref = lhs_t[:, rows].astype(np.float64).T @ rhs.astype(np.float64)
        return rel_err(np.asarray(out)[rows], ref)
    return Run((lhs_t, rhs), check)


def mamba_reference(delta, u, a, b, c):
    """Selective scan from its definition: h[n] = exp(delta*A[:, n]) h[n] + delta*u*B[n],
    y = sum_n C[n] h[n]; delta/u (batch, channels, seq), A (channels, state), B/C (batch, state,
    seq). float64."""
    delta, u, a, b, c = (np.asarray(x, dtype=np.float64) for x in (delta, u, a, b, c))
    batch, channels, seq = delta.shape
    out = np.zeros((batch, channels, seq))
    for i in range(batch):
        h = np.zeros((channels, a.shape[1]))
        for t in range(seq):
            h = np.exp(delta[i, :, t, None] * a) * h + (delta[i, :, t] * u[i, :, t])[:, None] * b[i, :, t]
            out[i, :, t] = h @ c[i, :, t]
    return out


def mamba(spec: dict, fetch_ref=None) -> Run:
    bsz, ch, seq, st = spec["batch"], spec["channels"], spec["seq_len"], spec["state_size"]
    rng = np.random.default_rng(SEED)
    delta = rng.uniform(0.0, 0.1, (bsz, ch, seq)).astype(np.float32)
    u = rng.standard_normal((bsz, ch, seq), dtype=np.float32)
    a = -rng.uniform(0.5, 1.5, (ch, st)).astype(np.float32)
    b = rng.standard_normal((bsz, st, seq), dtype=np.float32)
    c = rng.standard_normal((bsz, st, seq), dtype=np.float32)
    return Run((delta, u, a, b, c), lambda out: rel_err(out, mamba_reference(delta, u, a, b, c)),
               tolerance=1e-3)


def layernorm_reference(x, eps, gamma, beta):
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=1, keepdims=True)
    var = x.var(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def layernorm(spec: dict, fetch_ref=None) -> Run:
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((spec["rows"], spec["cols"]), dtype=np.float32)
    gamma = rng.standard_normal(spec["cols"], dtype=np.float32)
    beta = rng.standard_normal(spec["cols"], dtype=np.float32)
    eps = 1e-5
    return Run((x, eps, gamma, beta), lambda out: rel_err(out, layernorm_reference(x, eps, gamma, beta)),
               tolerance=1e-3)


def own(spec: dict, fetch_ref=None) -> Run:
    """The project's own equivalents (scripts/evidence/own_kernels.py)."""
    from . import own_kernels
    return own_kernels.build(spec)


BUILDERS = {"nkibench": nkibench, "matmul_tutorial": matmul_tutorial, "mamba": mamba,
            "layernorm": layernorm, "own": own}
