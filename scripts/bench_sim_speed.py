"""Simulation speed of nki_sim: wall time per simulated instruction (not a hardware figure).

Runs a synthetic flash-attention-like loop (load, matmul into PSUM, activation, PSUM +=
matmul) of about 10^4 instructions, with and without tracing, and prints a JSON record.

    python scripts/bench_sim_speed.py [--iters 2500]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import nki_sim  # noqa: E402
from nki_sim import isa as nisa  # noqa: E402
from nki_sim import language as nl  # noqa: E402
from nki_sim import nki_api as nki  # noqa: E402


def _kernel(q, kv, *, n):
    out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
    qt = nl.load(q)
    acc = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
    for i in nl.affine_range(n):
        kt = nl.load(kv[nl.ds((i % 8) * 128, 128), :])
        s = nl.matmul(qt, kt, transpose_x=True)                       # (128, 512) fp32 PSUM
        p = nisa.activation(np.exp, s, scale=0.1, dtype=nl.bfloat16)
        acc += nisa.nc_matmul(p[:, 0:128], kt[:, 0:128])
    nl.store(out, nl.copy(acc))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2500, help="loop iterations (4 instructions each)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    q = rng.random((128, 128)).astype(ml_dtypes.bfloat16)
    kv = rng.random((1024, 512)).astype(ml_dtypes.bfloat16)
    k = nki.jit(_kernel)
    k(q, kv, n=10)                                     # warm-up
    rows = []
    for traced in (False, True):
        t0 = time.perf_counter()
        if traced:
            with nki_sim.tracing() as tr:
                k(q, kv, n=args.iters)
            n = len(tr.events)
        else:
            k(q, kv, n=args.iters)
            n = 4 * args.iters + 4
        dt = time.perf_counter() - t0
        rows.append({"traced": traced, "instructions": n, "seconds": round(dt, 3),
                     "us_per_instruction": round(dt / n * 1e6, 1)})
    print(json.dumps({"benchmark": "nki_sim simulation speed (wall time, one process)",
                      "machine": platform.processor() or platform.machine(),
                      "numpy": np.__version__, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
