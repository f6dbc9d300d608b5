"""Simulation speed of nki_sim: wall time per simulated instruction (not a hardware figure).

Runs a synthetic flash-attention-like loop (load, matmul into PSUM, activation, PSUM +=
matmul) of about 10^4 instructions, with and without tracing, and prints one line per run
(wall time on this machine, measured; not a device figure).

    python scripts/bench_sim_speed.py [--iters 2500] [--quick] [--json out.json]

--quick: 250 iterations (about 10^3 instructions).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import nki_sim  # noqa: E402
from nki_pa_cli.script_args import add_common_args, parse_args, write_json  # noqa: E402
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=None,
                    help="loop iterations, 4 instructions each (default 2500; 250 with --quick)")
    add_common_args(ap, quick_help="250 iterations")
    args = parse_args(ap, argv)
    iters = (250 if args.quick else 2500) if args.iters is None else args.iters
    if iters < 1:
        ap.error(f"--iters must be >= 1; got {iters}")
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
                k(q, kv, n=iters)
            n = len(tr.events)
        else:
            k(q, kv, n=iters)
            n = 4 * iters + 4
        dt = time.perf_counter() - t0
        rows.append({"traced": traced, "instructions": n, "seconds": round(dt, 3),
                     "us_per_instruction": round(dt / n * 1e6, 1)})
    machine = platform.processor() or platform.machine()
    print(f"nki_sim simulation speed (wall time, one process, {machine}, numpy {np.__version__}):")
    for r in rows:
        print(f"  {'traced' if r['traced'] else 'untraced':8}  {r['instructions']:>6} instructions  "
              f"{r['seconds']:>7.3f} s  {r['us_per_instruction']:>6.1f} us/instruction")
    write_json(args, __file__, rows, machine=machine, numpy=np.__version__)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
