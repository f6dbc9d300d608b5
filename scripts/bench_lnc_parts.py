#!/usr/bin/env python
"""MODELED: the scheduled and the MLA kernel on one and on both physical cores of a trn2
logical core when their KV heads cannot be split between the cores.

A tensor-parallel rank of the benchmark's model (H=32, Hkv=8, d=128) over 8 ranks holds H=4
query heads and ONE KV head; with an odd Hkv the host cuts each class's items in two parts by
query group, one per core (docs/layouts.md §16.3 "Item parts"). Every batch of
scripts/bench_paged_attention.py (bf16, mixed precision, block 32, large_tile_size="auto") runs
at that geometry on trn2, on the current and the legacy API, at LNC 1 and LNC 2, through
``host.paged_attention`` on nki_sim; ``nki_sim.cost.estimate_cores`` models each core and the
launch takes the slower one (docs/cost-model.md). Efficiency = useful-work roofline / modeled
time, per physical core used (as in bench_paged_attention.py). MLA's latent cache is one KV
head too: the decode batches of scripts/bench_mla.py (H=16, E=576, bf16, block 64, LT 2048) run
the same way (its useful roofline). The script stops unless each LNC 2 output is within the
bf16 tolerance of its LNC 1 output.

    python scripts/bench_lnc_parts.py --quick
    python scripts/bench_lnc_parts.py --json out/bench/lnc_parts.json \\
        --markdown docs/bench-lnc-parts.md
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

import numpy as np  # noqa: E402

from nki_pa_cli.script_args import (add_common_args, add_markdown_arg,  # noqa: E402
                                    git_commit, parse_args, write_json, write_markdown)

HEADS, KV_HEADS = 4, 1          # one tensor-parallel rank of the 32 / 8-head model over 8
APIS = ("nki", "legacy")
FULL = ("decode_32", "decode_64", "decode_128", "mixed_2x+30", "mixed_4x512+60",
        "prefill_2k_on_2k", "prefill_1k_on_0")
QUICK = ("decode_8", "mixed_1x128+6")
MLA_FULL, MLA_QUICK = ("16 x 2K", "64 x 4K", "32 x 2K-16K"), ("2 x 2K",)
MLA_HEADS, MLA_ENTRY = 16, 576
ATOL = 3e-2                     # bf16 mixed precision: LNC 2 against LNC 1, elementwise


def run(w, api: str) -> list:
    """Rows of benchmark workload ``w`` (scheduled kernel) on ``api`` at LNC 1 and 2 (trn2)."""
    import _pa_runs as runs
    import _pa_workloads as wl

    batch = wl.make_batch(w, 32, heads=HEADS, kv_heads=KV_HEADS)
    geo = dict(heads=HEADS, kv_heads=KV_HEADS)
    rows, outs = [], {}
    for lnc in (1, 2):
        out, trace, sec, meta = runs.simulate("scheduled", batch, "trn2", api=api, lnc=lnc)
        outs[lnc] = np.asarray(out, np.float32)
        row = runs.make_row(w, 32, "trn2", "scheduled", trace, sec, meta, geometry=geo, api=api,
                            lnc=lnc)
        rows.append({k: row[k] for k in ("workload", "api", "lnc", "modeled_us",
                                         "useful_roofline_us", "efficiency", "per_core_us")}
                    | {"kernel": "scheduled", "sim_s": sec})
    return _compared(rows, outs, w.name, api)


def run_mla(w, api: str) -> list:
    """Rows of MLA decode workload ``w`` (scripts/bench_mla.py) on ``api`` at LNC 1 and 2."""
    import bench_mla
    from nki_sim import cost

    batch = bench_mla.make_batch(w, MLA_HEADS)
    roof = bench_mla.useful_roofline(batch, "trn2")[0]
    rows, outs = [], {}
    for lnc in (1, 2):
        out, trace, sec = bench_mla.simulate(batch, MLA_ENTRY, "trn2", api=api, lnc=lnc)
        outs[lnc] = np.asarray(out, np.float32)
        rep = cost.estimate_cores(trace, "trn2")
        rows.append(dict(workload=w.name, api=api, lnc=lnc, kernel="mla",
                         modeled_us=rep.launch_us, useful_roofline_us=roof / lnc,
                         efficiency=roof / lnc / rep.launch_us,
                         per_core_us=[r.modeled_us for r in rep.per_core.values()], sim_s=sec))
    return _compared(rows, outs, w.name, api)


def _compared(rows, outs, name, api):
    err = float(np.abs(outs[2] - outs[1]).max())
    if not err <= ATOL:
        raise SystemExit(f"{name} ({api}): LNC 2 differs from LNC 1 by {err:.3g} > {ATOL}")
    rows[1]["vs_lnc1"] = rows[1]["modeled_us"] / rows[0]["modeled_us"]
    rows[1]["max_abs_diff_vs_lnc1"] = err
    return rows


def table(rows: list) -> str:
    out = ["| kernel | batch | API | LNC 1 us (eff) | LNC 2 us (eff per core) | cores us | "
           "LNC 2 / LNC 1 |", "|---|---|---|---:|---:|---|---:|"]
    by = {(r["kernel"], r["workload"], r["api"], r["lnc"]): r for r in rows}
    for (kernel, name, api, lnc), r in by.items():
        if lnc != 2:
            continue
        one = by[(kernel, name, api, 1)]
        cores = " / ".join(f"{u:.0f}" for u in r["per_core_us"])
        out.append(f"| {kernel} | {name} | {api} | {one['modeled_us']:.0f} "
                   f"({one['efficiency']:.2f}) | "
                   f"{r['modeled_us']:.0f} ({r['efficiency']:.2f}) | {cores} | "
                   f"{r['vs_lnc1']:.3f}x |")
    return "\n".join(out)


def markdown(rows: list, cmd: str, commit: str) -> str:
    return "\n".join([
        "# Both cores of a trn2 logical core with one KV head (MODELED)", "",
        f"Generated by `{cmd}` at commit {commit}; "
        "every figure is MODELED by `nki_sim.cost` (docs/cost-model.md), nothing ran on "
        f"hardware. H = {HEADS}, Hkv = {KV_HEADS} (one tensor-parallel rank of the 32 / 8-head "
        "benchmark model over 8 ranks), d = 128, bf16, block 32, trn2. With one KV head the "
        "cores cannot split the heads; the host cuts each class's items in two parts by query "
        "group and core c runs part c (docs/layouts.md §16.3 \"Item parts\"). The batches are "
        "those of [bench-scheduled.md](bench-scheduled.md); the MLA rows are decode batches of "
        f"[bench-mla.md](bench-mla.md) (H = {MLA_HEADS}, E = {MLA_ENTRY}, one latent head).", "",
        table(rows), "",
        "A part takes whole groups, and both parts run the same static item counts (the larger "
        "part's bucket), so a class with few groups of unequal work (one long prefill chunk "
        "beside a short one) splits less evenly than a decode class; each core also pays the "
        "launch's fixed work (tile set-up, the first and last DMA latency), which weighs more "
        "in these short one-head launches than in the 8-head ones.", ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, quick_help="two small batches (decode_8, mixed_1x128+6)")
    add_markdown_arg(ap)
    args = parse_args(ap, argv)
    import _pa_workloads as wl

    import bench_mla

    ws = {w.name: w for w in wl.make_workloads(args.quick)}
    mla = {w.name: w for w in bench_mla.make_workloads(args.quick)}
    jobs = [(run, ws[n]) for n in (QUICK if args.quick else FULL)]
    jobs += [(run_mla, mla[n]) for n in (MLA_QUICK if args.quick else MLA_FULL)]
    rows = []
    for fn, w in jobs:
        for api in APIS:
            t0 = time.perf_counter()
            got = fn(w, api)
            rows += got
            print(f"{got[0]['kernel']} {w.name} {api}: LNC 1 {got[0]['modeled_us']:.1f} us, "
                  f"LNC 2 {got[1]['modeled_us']:.1f} us ({got[1]['vs_lnc1']:.3f}x; MODELED), "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    print(table(rows))
    write_json(args, __file__, rows, commit=git_commit(), heads=HEADS, kv_heads=KV_HEADS)
    write_markdown(args, __file__, argv, lambda cmd, commit: markdown(rows, cmd, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
