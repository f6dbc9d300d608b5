"""Inputs and references of the evidence cases (``measurements.json`` field ``inputs.builder``).

Each builder returns a :class:`Run`: the kernel's positional arguments (NumPy, seeded) and a
``check(out) -> float`` giving the largest error of the kernel output relative to the largest
reference magnitude. References are float64 NumPy written from each operation's definition,
except ``nkibench``, which uses the benchmark's own NumPy reference module (fetched with the
kernel: ``get_inputs`` / ``forward`` / ``transform_*``), the reference its authors checked
the kernel against.

A builder may also say how the kernel is obtained (``Run.load_kernel``) when the fetched file
cannot be imported on its own: ``pantheon`` builds the kernels of pantheongpu/pantheonneuron,
which a factory function of a package module constructs.
"""
from __future__ import annotations

import importlib.util
import sys
import types
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
    # (fetched kernel file, table's function name) -> kernel; None: the function of the module
    load_kernel: Callable[[Path, str], Callable] | None = None


def load_module(path: Path, name: str):
    """Import a fetched source file as a module of its own (never put on sys.path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    if "." in name:                  # a package's submodule: its relative imports look it up
        sys.modules[name] = mod
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


# --- pantheongpu/pantheonneuron ---------------------------------------------------------------
# Its kernels are built by a factory function (``_build_kernel(...)``, ``build_prefetch(depth)``)
# of a module that imports the repository's own helpers: ``from . import tiling`` (the kernels
# read ``tiling.PARTITION``), and modules only the file's host-side harness uses (device run,
# profiler, registry). ``inputs.helpers`` names the helpers fetched (name -> [path, commit]);
# ``inputs.empty_modules`` the harness-only ones, given as empty modules (a kernel that reached
# into one would fail with AttributeError, not run differently). ``inputs.package`` is the
# package name the file imports them from.

def _in_package(spec: dict, fetch_ref: Callable) -> Callable[[Path, str], Callable]:
    pkg = spec.get("package", "kernels")

    def load_kernel(path: Path, function: str):
        saved = {k: m for k, m in sys.modules.items() if k == pkg or k.startswith(pkg + ".")}
        saved_path = list(sys.path)
        for k in saved:
            del sys.modules[k]
        try:
            package = sys.modules[pkg] = types.ModuleType(pkg)
            package.__path__ = []
            for name in spec.get("empty_modules", []):
                setattr(package, name, types.ModuleType(f"{pkg}.{name}", "harness-only import"))
                sys.modules[f"{pkg}.{name}"] = getattr(package, name)
            for name, (hpath, commit) in spec.get("helpers", {}).items():
                setattr(package, name, load_module(fetch_ref(hpath, commit), f"{pkg}.{name}"))
            mod = load_module(path, f"{pkg}.evidence_kernel")
            made = getattr(mod, function)(*spec.get("factory_args", []))
        finally:
            for k in [k for k in sys.modules if k == pkg or k.startswith(pkg + ".")]:
                del sys.modules[k]
            sys.modules.update(saved)
            sys.path[:] = saved_path
        kernel = made[-1] if isinstance(made, tuple) else made
        if getattr(kernel, "__name__", None) != spec["kernel_name"]:
            raise ValueError(f"{function}{tuple(spec.get('factory_args', []))} must return kernel "
                             f"{spec['kernel_name']!r}; got {getattr(kernel, '__name__', kernel)!r}")
        return kernel
    return load_kernel


def _max_abs_diff(out, expected_tile, tile_rows: int, chunk: int = 64) -> float:
    """max |out - expected| where ``out`` (rows, F) must repeat or equal row blocks of
    ``expected_tile(i)`` (block i of ``tile_rows`` rows); chunked (no float64 copy of the
    whole buffer)."""
    out = np.asarray(out)
    blocks = out.shape[0] // tile_rows
    worst = 0.0
    for b0 in range(0, blocks, chunk):
        b1 = min(blocks, b0 + chunk)
        got = out[b0 * tile_rows:b1 * tile_rows].astype(np.float32)
        want = np.concatenate([expected_tile(i) for i in range(b0, b1)]).astype(np.float32)
        worst = max(worst, float(np.max(np.abs(got - want))))
    return worst


def pantheon(spec: dict, fetch_ref: Callable) -> Run:
    """Inputs and references of the pantheonneuron kernels (``inputs.workload``):

    * ``read_sum``: source (rows, free) bf16 of small integers; the kernel returns the
      [128, 1] fp32 per-partition sum over every 128-row tile (exact in fp32);
    * ``broadcast_write``: source one [128, free] bf16 tile; the output (rows, free) repeats it;
    * ``copy``: output == source (rows, free) bf16;
    * ``matmul``: lhsT [K, M], rhs [K, N] bf16 -> [M, N] fp32 (``matmul_tutorial``'s check)."""
    rows, free, part = spec.get("rows"), spec.get("free"), 128
    rng = np.random.default_rng(SEED)
    work = spec["workload"]
    if work == "matmul":
        run = matmul_tutorial(spec)
    elif work == "read_sum":
        if rows % part:
            raise ValueError(f"rows must be a multiple of {part}; got {rows}")
        vals = rng.integers(-3, 4, (rows, free), dtype=np.int8)
        ref = vals.reshape(rows // part, part, free).sum(axis=(0, 2), dtype=np.int64)[:, None]
        x = vals.astype(ml_dtypes.bfloat16)
        del vals
        run = Run((x,), lambda out: rel_err(out, ref), tolerance=1e-6)
    elif work in ("broadcast_write", "copy"):
        x = rng.integers(-3, 4, (part if work == "broadcast_write" else rows, free),
                         dtype=np.int8).astype(ml_dtypes.bfloat16)

        def check(out):
            if np.shape(out) != (rows, free):
                raise ValueError(f"kernel output shape {np.shape(out)} != ({rows}, {free})")
            tile = (lambda i: x) if work == "broadcast_write" else (lambda i: x[i * part:(i + 1) * part])
            return _max_abs_diff(out, tile, part) / float(np.max(np.abs(x.astype(np.float32))))
        run = Run((x,), check, tolerance=0.0)
    else:
        raise ValueError(f"workload must be read_sum, broadcast_write, copy or matmul; got {work!r}")
    run.load_kernel = _in_package(spec, fetch_ref)
    return run


BUILDERS = {"nkibench": nkibench, "matmul_tutorial": matmul_tutorial, "mamba": mamba,
            "layernorm": layernorm, "own": own, "pantheon": pantheon}
