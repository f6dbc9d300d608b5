"""Simulation speed of nki_sim: wall time per simulated instruction (not a hardware figure).

Two workloads, each run untraced and traced (best of ``--repeat`` runs; wall time and CPU
time of this process, the latter less sensitive to other processes sharing the cores); one
line per run (measured on this machine; not a device figure):

* ``micro``: a synthetic flash-attention-like loop (load, matmul into PSUM, activation, PSUM +=
  matmul) on 128 x 512 tiles, 4 instructions per iteration (about 10^4 instructions);
  ``micro-numpy`` is the same arithmetic done directly in NumPy (the floor no simulator can
  beat: the rest of ``micro`` is simulator overhead).
* ``flash``: ``host.paged_attention`` (backend="sim") with the dense flash paged-attention
  kernel (``kernel="dense"``, no GQA packing) and the scheduled kernel, each on trn1 and trn2
  through the legacy API (``api="legacy"``), and the scheduled kernel on trn2 through the current
  ``nki`` API (``api="nki"``): 4 sequences (one 128-token prefill chunk, three decodes), 1024
  context tokens each, H=8, Hkv=2, d=128, block size 32, bf16, LARGE_TILE_SZ=1024.

Instructions are counted from the trace (every engine instruction and every DMA).

    python scripts/bench_sim_speed.py [--iters 2500] [--repeat 3] [--only micro|flash]
                                      [--quick] [--json out.json]

--quick: the micro workload only, 250 iterations (about 10^3 instructions), one run each.
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
from nki_sim.legacy import isa as nisa  # noqa: E402
from nki_sim.legacy import language as nl  # noqa: E402
from nki_sim.legacy import nki_api as nki  # noqa: E402


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


def _numpy_micro(q, kv, n):
    """The bare NumPy work of ``_kernel`` (same arrays, dtypes and casts, no simulator)."""
    bf16, f32 = ml_dtypes.bfloat16, np.float32
    qt = np.array(q)
    acc = np.zeros((128, 128), f32)
    for i in range(n):
        kt = np.array(kv[(i % 8) * 128:(i % 8) * 128 + 128, :])
        s = np.matmul(qt.astype(f32).T, kt.astype(f32))
        p = np.exp(s * f32(0.1)).astype(bf16)
        acc += np.matmul(p[:, 0:128].astype(f32).T, kt[:, 0:128].astype(f32))
    return acc


def _best(fn, repeat):
    """Smallest wall time and smallest CPU time of this process over ``repeat`` calls of ``fn``
    (seconds)."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu


def _row(workload, traced, n, wall, cpu, **extra):
    return {"workload": workload, **extra, "traced": traced, "instructions": n,
            "seconds": round(wall, 3), "us_per_instruction": round(wall / n * 1e6, 1),
            "cpu_us_per_instruction": round(cpu / n * 1e6, 1)}


def _rows(workload, run, repeat, **extra):
    """Untraced and traced timings of ``run`` with the instruction count of its trace."""
    run()                                              # warm-up (imports, caches)
    with nki_sim.tracing() as tr:
        run()
    n = len(tr.events)
    rows = []
    for traced in (False, True):
        def once():
            if traced:
                with nki_sim.tracing():
                    run()
            else:
                run()
        rows.append(_row(workload, traced, n, *_best(once, repeat), **extra))
    return rows


def micro_rows(iters, repeat, floor=True):
    rng = np.random.default_rng(0)
    q = rng.random((128, 128)).astype(ml_dtypes.bfloat16)
    kv = rng.random((1024, 512)).astype(ml_dtypes.bfloat16)
    k = nki.jit(_kernel)
    rows = _rows("micro", lambda: k(q, kv, n=iters), repeat)
    if floor:
        from nki_sim.blas import single_threaded
        with single_threaded():                 # as during a kernel run
            rows.append(_row("micro-numpy", False, rows[0]["instructions"],
                             *_best(lambda: _numpy_micro(q, kv, iters), repeat)))
    return rows


def flash_inputs(seed=0):
    """Inputs of the ``flash`` workload (module docstring)."""
    S, H, HKV, D, B, CTX = 4, 8, 2, 128, 32, 1024
    rng = np.random.default_rng(seed)
    qlens = np.array([128, 1, 1, 1])
    clens = np.full(S, CTX)
    nblk = CTX // B
    N = S * nblk + 3
    bt = rng.permutation(N)[:S * nblk].reshape(S, nblk).astype(np.int32)
    T = int(qlens.sum())
    u = lambda *s: rng.uniform(-1, 1, s).astype(ml_dtypes.bfloat16)  # noqa: E731
    return (u(T, H, D), u(T, HKV, D), u(T, HKV, D), u(2, N, HKV, B, D), bt, qlens, clens)


def flash_rows(repeat):
    from host.attention import paged_attention
    args = flash_inputs()
    rows = []
    runs = [(kernel, target, "legacy", opts) for kernel, opts in
            (("dense", {"gqa_packing": False, "lnc": 1}), ("scheduled", {}))
            for target in ("trn1", "trn2")]
    runs.append(("scheduled", "trn2", "nki", {}))
    for kernel, target, api, opts in runs:
        def run():
            with nki_sim.use_target(target):
                paged_attention(*args, large_tile_size=1024, backend="sim", kernel=kernel, api=api,
                                **opts)
        rows += _rows("flash", run, repeat, kernel=kernel, target=target, api=api)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=None,
                    help="micro: loop iterations, 4 instructions each (default 2500; 250 with --quick)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="timed runs per row, the best is reported (default 3; 1 with --quick)")
    ap.add_argument("--only", choices=("micro", "flash"), help="run one workload only")
    add_common_args(ap, quick_help="micro workload only, 250 iterations, one run per row")
    args = parse_args(ap, argv)
    iters = (250 if args.quick else 2500) if args.iters is None else args.iters
    repeat = (1 if args.quick else 3) if args.repeat is None else args.repeat
    if iters < 1:
        ap.error(f"--iters must be >= 1; got {iters}")
    if repeat < 1:
        ap.error(f"--repeat must be >= 1; got {repeat}")
    rows = []
    if args.only in (None, "micro"):
        rows += micro_rows(iters, repeat, floor=not args.quick)
    if args.only in (None, "flash") and not args.quick:
        rows += flash_rows(repeat)
    machine = platform.processor() or platform.machine()
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"nki_sim simulation speed (wall and CPU time of one process, {machine}, {os.cpu_count()} "
          f"cpus, load average {load[0]}, numpy {np.__version__}):")
    for r in rows:
        what = " ".join(str(r[k]) for k in ("workload", "kernel", "target", "api") if k in r)
        print(f"  {what:29} {'traced' if r['traced'] else 'untraced':8}  {r['instructions']:>6} "
              f"instructions  {r['seconds']:>7.3f} s  {r['us_per_instruction']:>6.1f} us/instruction"
              f"  (CPU {r['cpu_us_per_instruction']:>6.1f})")
    write_json(args, __file__, rows, machine=machine, numpy=np.__version__, cpus=os.cpu_count(),
               load_average=load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
