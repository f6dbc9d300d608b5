#!/usr/bin/env python
"""MODELED: where a paged-attention run's time goes, by the kernel line that called the op layer.

Each run is one batch of scripts/bench_paged_attention.py (H=32, Hkv=8, d=128, bf16, block 32,
mixed precision) through ``host.paged_attention`` on nki_sim, traced with
``nki_sim.tracing(call_sites_past=("nki_kernels/ops/",))``: an instruction is attributed to the
kernel line that called the op layer (``sched_core.py:283``), not to the op layer's own line
(``legacy.py:317``, which every caller of the op shares). For each engine, each shared port
(trn1: VectorE + ScalarE on PSUM, VectorE + GpSimd on SBUF; trn2: VectorE's performance mode on
GpSimd's bus) and the DMA queues it prints the cost model's total and the call sites with the
most busy time (``_pa_runs.breakdown``, as the benchmark's ``--breakdown``: compute cycles /
clock; a DMA's mean busy time over the 16 DMA engines; GpSimd also carries the software-DGE
descriptors of indirect DMAs) and their instruction counts. One physical core (``lnc=1``). Every time is MODELED.

    python scripts/profile_call_sites.py --quick
    python scripts/profile_call_sites.py mixed_2x+30:trn1 decode_32:trn2:nki --top 12
    python scripts/profile_call_sites.py prefill_2k_on_2k:trn2 --kernel dense --json out/p.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from nki_pa_cli.script_args import add_common_args, git_commit, parse_args, write_json  # noqa: E402

OP_LAYER = "nki_kernels/ops/"
QUICK = ("decode_8:trn1", "mixed_1x128+6:trn2")
TARGETS = ("trn1", "trn2")


def parse_run(spec: str) -> tuple:
    """``workload:target[:api]`` -> (workload, target, api or None)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[1] not in TARGETS:
        raise ValueError(f"run must be workload:target[:api] with target in {TARGETS}; "
                         f"got {spec!r}")
    return parts[0], parts[1], (parts[2] if len(parts) == 3 else None)


def run(spec: str, kernel: str, top: int) -> dict:
    """One profiled run -> a JSON row."""
    import _pa_runs
    import nki_sim
    from _pa_workloads import make_batch, make_workloads

    import host
    from nki_sim import cost

    name, target, api = parse_run(spec)
    workloads = {w.name: w for q in (True, False) for w in make_workloads(q)}
    if name not in workloads:
        raise ValueError(f"workload must be one of {sorted(workloads)}; got {name!r}")
    batch = make_batch(workloads[name], 32)
    t0 = time.perf_counter()
    with nki_sim.use_target(target), nki_sim.tracing(call_sites_past=(OP_LAYER,)) as trace:
        host.paged_attention(**batch, kernel=kernel, backend="sim", mixed_precision=True,
                             api=api, lnc=1)
    bd = _pa_runs.breakdown(trace, target, top, ports=True)
    modeled = bd.pop("modeled_us")
    order = sorted(bd, key=lambda k: -bd[k]["us"])
    return dict(run=spec, kernel=kernel, workload=name, target=target, api=api,
                modeled_us=modeled, bottleneck=cost.estimate(trace, target).bottleneck,
                sim_seconds=time.perf_counter() - t0,
                resources={k: dict(us=bd[k]["us"], sites=[list(x) for x in bd[k]["kinds"]])
                           for k in order})


def text(row: dict) -> str:
    lines = [f"== {row['run']} ({row['kernel']}): {row['modeled_us']:.1f} us MODELED, "
             f"bottleneck {row['bottleneck']} ({row['sim_seconds']:.0f} s)"]
    for name, r in row["resources"].items():
        lines.append(f"  {name:20s} {r['us']:9.1f} us")
        lines += [f"      {us:9.1f} {n:7d}  {site}" for site, us, n in r["sites"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", metavar="workload:target[:api]",
                    help="e.g. decode_32:trn2:nki (workloads: scripts/_pa_workloads.py)")
    ap.add_argument("--kernel", choices=("scheduled", "dense"), default="scheduled")
    ap.add_argument("--top", type=int, default=8, help="call sites per resource (>= 1)")
    add_common_args(ap, quick_help=f"the small runs {', '.join(QUICK)}")
    args = parse_args(ap, argv)
    if args.top < 1:
        ap.error(f"--top must be >= 1; got {args.top}")
    specs = list(args.runs) or (list(QUICK) if args.quick else [])
    if not specs:
        ap.error("give at least one run (workload:target[:api]) or --quick")
    for spec in specs:
        try:
            parse_run(spec)
        except ValueError as e:
            ap.error(str(e))
    rows = []
    for spec in specs:
        rows.append(run(spec, args.kernel, args.top))
        print(text(rows[-1]), flush=True)
    write_json(args, __file__, rows, commit=git_commit(), op_layer=OP_LAYER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
