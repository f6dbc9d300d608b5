#!/usr/bin/env python
"""MODELED benchmark: is paged attention efficient on the batches a serving engine sends?

Each (workload, kernel, block size, target) runs on nki_sim under tracing; nki_sim.cost turns
the trace into MODELED per-engine times (docs/cost-model.md; its constants are used unchanged).
Nothing is measured on hardware. Efficiency is judged by USEFUL work only
(scripts/_pa_workloads.py): useful roofline = max(useful HBM bytes / BW, useful FLOPs / TensorE
bf16 peak), BW = min(HBM per core, 16 DMA engines x practical bandwidth), efficiency = useful
roofline / modeled time. The cost model's own fraction_of_roofline counts every byte and FLOP
the kernel does, wasted or not; it appears only as a labelled secondary column.

    python scripts/bench_paged_attention.py --quick
    python scripts/bench_paged_attention.py --json full.json --markdown docs/bench-scheduled.md \\
        --plot docs/bench-scheduled.png --breakdown
    # the same sweep as two processes (one per target), then one report from both JSON files:
    python scripts/bench_paged_attention.py --targets trn1 --breakdown --json trn1.json &
    python scripts/bench_paged_attention.py --targets trn2 --breakdown --json trn2.json; wait
    python scripts/bench_paged_attention.py --table-from trn1.json trn2.json --breakdown \\
        --markdown docs/bench-scheduled.md --plot docs/bench-scheduled.png

Kernels (scripts/_pa_runs.py): scheduled (host default), dense (GQA packing "auto"), per_block
(the dense kernel with one DMA per cache block). H=32, Hkv=8, d=128, bf16 queries and cache,
mixed precision; LARGE_TILE_SZ=2048 for the dense kernels, the host default large_tile_size="auto"
for the scheduled kernel (docs/layouts.md 16.3). The scheduled kernel runs on the API of --api (auto: trn1
legacy, trn2 the current nki API) with each LNC of --lnc (trn2: 1 and 2 physical cores; rows
"trn2-lnc2": the KV heads split between the two cores, modeled time = the slower core's,
efficiency per physical core used); the dense kernels on grid [1, Hkv] on one NeuronCore.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _pa_report as report  # noqa: E402
import _pa_runs as runs  # noqa: E402
import _pa_workloads as workloads  # noqa: E402
from _pa_runs import KERNELS, breakdown, kernel_inputs, make_row, simulate  # noqa: E402,F401
from _pa_workloads import HKV, H, make_batch, make_workloads  # noqa: E402
from nki_pa_cli.script_args import (AUTO_API, add_api_arg, api_runs,  # noqa: E402
                                    check_api_targets, command_line, git_commit)

TARGETS = ("trn1", "trn2")
BLOCK = 32                     # block size of every workload; 16 / 128 in the sensitivity rows
SENSITIVITY = {"workload": "decode_32", "blocks": (16, 128), "target": "trn2"}
# The dense kernels do O(Q tiles x context tiles) work: they run where the host's own count of
# 128x128 score blocks per KV head (host.dense.gqa_packing.gqa_packing_work) is at most this budget
# (about 3 simulator minutes per target); larger workloads are listed as skipped with the count.
DENSE_BLOCK_BUDGET = {"dense": 16000, "per_block": 6000}
QUICK_BLOCK_BUDGET = {"dense": 1000, "per_block": 0}
TRN2_ONLY = {"decode_256"}     # the x8 decode scaling point, on one target (sweep time)


def expand_lnc(jobs, lncs, api: str):
    """(workload, block, kernel, target) jobs -> (..., api, lnc): the scheduled kernel on each
    API ``api`` runs on ``t`` (``nki_pa_cli.script_args.api_runs``; "both": legacy, then nki on
    trn2) at every LNC of ``lncs`` (trn1 and the block-size sensitivity rows: 1 only), the dense
    kernels at LNC 1 on the legacy API."""
    out = []
    for w, b, k, t in jobs:
        if k != "scheduled":
            out.append((w, b, k, t, "legacy", 1))
            continue
        for _, a in api_runs(api, [t]):
            out += [(w, b, k, t, a, n) for n in sorted(set(lncs))
                    if n == 1 or (t != "trn1" and b == BLOCK)]     # block-size rows: LNC 1 only
    return out


def score_blocks(w, kernel: str) -> int:
    """128x128 score blocks per KV head of the dense kernels (per_block never packs)."""
    from host.dense.gqa_packing import choose_gqa_packing, gqa_packing_work
    unpacked, packed = gqa_packing_work(w.query_lens, H, HKV, context_lens=w.context_lens)
    if kernel == "per_block":
        return unpacked
    return packed if choose_gqa_packing(w.query_lens, H, HKV, context_lens=w.context_lens) \
        else unpacked


def sweep_plan(workloads, targets, kernels, quick: bool):
    """(jobs, skipped): jobs are (workload, block, kernel, target); skipped says why not."""
    budget = QUICK_BLOCK_BUDGET if quick else DENSE_BLOCK_BUDGET
    jobs, skipped = [], []
    for w in workloads:
        tgts = [t for t in targets if quick or w.name not in TRN2_ONLY or t == "trn2"]
        if len(tgts) < len(targets):
            skipped.append(dict(workload=w.name, kernel="all", targets=sorted(set(targets) - set(tgts)),
                                reason="trn2 only: the x8 decode scaling point, simulated on one target to bound the sweep time"))
        if not tgts:
            continue
        for k in kernels:
            if k != "scheduled":
                n = score_blocks(w, k)
                if n > budget[k]:
                    skipped.append(dict(workload=w.name, kernel=k, targets=list(tgts), reason=(
                        f"{n} score blocks per KV head > budget {budget[k]} (O(queries x context) "
                        f"simulation time)")))
                    continue
            jobs += [(w, BLOCK, k, t) for t in tgts]
    # scheduled first within a (workload, block, target): the others are compared against it
    order = {k: i for i, k in enumerate(KERNELS)}
    jobs.sort(key=lambda j: (workloads.index(j[0]), j[3], order[j[2]]))
    if not quick and SENSITIVITY["target"] in targets and "scheduled" in kernels:
        for w in (w for w in workloads if w.name == SENSITIVITY["workload"]):
            jobs += [(w, b, "scheduled", SENSITIVITY["target"]) for b in SENSITIVITY["blocks"]]
    return jobs, skipped


def breakdown_cases(workloads) -> set:
    """The first decode and the first mixed workload: the per-engine breakdowns of their
    scheduled and dense runs get printed."""
    out = set()
    for kind in ("decode", "mixed"):
        names = [w.name for w in workloads if w.kind == kind]
        if names:
            out.add(names[0])
    return out


def run_sweep(jobs, want_breakdown=(), progress=True):
    """Simulate every job -> (rows, breakdowns). Rows of dense / per_block carry the max
    |output - scheduled output| of the same (workload, block, target) when both ran."""
    from _progress import Progress

    import numpy as np
    rows, bds = [], {}
    batch_key, batch, ref = None, None, {}
    with Progress(len(jobs), label="bench", enabled=None if progress else False) as bar:
        for w, b, k, t, api, lnc in jobs:
            if batch_key != (w.name, b):            # one batch alive at a time
                batch_key, batch, ref = (w.name, b), make_batch(w, b), {}
            out, trace, sec, meta = simulate(k, batch, t, api=api, lnc=lnc)
            row = make_row(w, b, t, k, trace, sec, meta, api=api, lnc=lnc)
            label = row["target"]
            if w.name in want_breakdown and b == BLOCK and k != "per_block":
                one = trace if lnc == 1 else SimpleNamespace(      # core 0 of an LNC=2 launch
                    events=[e for e in trace.events if e.attr("core", 0) == 0])
                bds[f"{w.name}|{k}|{label}"] = breakdown(one, t)
            del trace
            o = np.asarray(out, np.float64)
            if k == "scheduled":
                ref[t] = o
            elif t in ref:
                row["max_abs_diff_vs_scheduled"] = float(np.max(np.abs(o - ref[t])))
            rows.append(row)
            note = f"{w.name} B={b} {k} {label} {api}: {sec:.0f} s"
            bar.advance(note=note)
            if progress and not bar.enabled:       # not a terminal: one log line per job
                print(f"bench {bar.done}/{len(jobs)} {note}", file=sys.stderr, flush=True)
    return rows, bds


def merge_docs(docs: list, names: list) -> dict:
    """One report document from the JSON documents of several processes of the same sweep
    (e.g. one per --targets): rows in the order one process would have written them (workload,
    then target; the block-size rows last), skipped / breakdowns joined, CPU seconds summed,
    wall seconds the longest process's. The documents must agree on the commits, quick and the
    head counts (ValueError naming the file that differs)."""
    if len(docs) == 1:
        return docs[0]
    first = docs[0]
    for name, d in zip(names[1:], docs[1:]):
        for key in ("commit", "code_commit", "quick", "heads"):
            if d.get(key) != first.get(key):
                raise ValueError(f"--table-from: {name} has {key} {d.get(key)!r}, but {names[0]} "
                                 f"has {first.get(key)!r}; merge runs of one sweep only")
    rows = [r for d in docs for r in d["rows"]]
    order = {w.name: i for i, w in enumerate(make_workloads(bool(first.get("quick"))))}
    for r in rows:                                   # (workloads of another version: last)
        order.setdefault(r["workload"], len(order))
    block = max(set(r["block_size"] for r in rows), key=[r["block_size"] for r in rows].count)
    rows.sort(key=lambda r: (r["block_size"] != block, order[r["workload"]],
                             r["target"].split("-")[0]))
    return dict(first, rows=rows, skipped=[s for d in docs for s in d.get("skipped", [])],
                breakdowns={k: v for d in docs for k, v in d.get("breakdowns", {}).items()},
                wall_seconds=max(d.get("wall_seconds", 0) for d in docs),
                cpu_seconds=sum(d.get("cpu_seconds", 0) for d in docs), processes=len(docs),
                command=" & ".join(d.get("command", "") for d in docs))


def require_matplotlib() -> None:
    """Fail BEFORE the sweep when --plot cannot be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"--plot needs matplotlib (pip install matplotlib): {exc}") from exc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two small workloads (about a minute)")
    ap.add_argument("--json", metavar="PATH", help="write rows, breakdowns and metadata (MODELED)")
    ap.add_argument("--markdown", metavar="PATH", help="write the Markdown report")
    ap.add_argument("--plot", metavar="PATH", help="PNG: modeled time and efficiency vs batch size")
    ap.add_argument("--breakdown", action="store_true",
                    help="print where the modeled time goes (one decode, one mixed workload)")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    ap.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    add_api_arg(ap, default="auto", what="the scheduled kernel")
    ap.add_argument("--lnc", nargs="+", type=int, choices=(1, 2), default=[1, 2],
                    help="physical cores per launch of the scheduled kernel on trn2")
    ap.add_argument("--workloads", nargs="+", metavar="NAME", help="subset of workload names")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--table-from", metavar="JSON", nargs="+",
                    help="only render the report of --json file(s); several: the processes of one "
                         "sweep (e.g. one per target), merged")
    a = ap.parse_args(argv)
    if not a.table_from:
        check_api_targets(ap, a.api, a.targets)
    if a.plot:
        require_matplotlib()
    if a.table_from:
        try:
            doc = merge_docs([json.loads(Path(f).read_text()) for f in a.table_from], a.table_from)
        except ValueError as exc:
            ap.error(str(exc))
        if len(a.table_from) > 1:            # the report names the render step too
            doc["command"] += ", then " + command_line(
                "bench_paged_attention.py", sys.argv[1:] if argv is None else argv)
    else:
        wls = make_workloads(a.quick)
        if a.workloads:
            unknown = sorted(set(a.workloads) - {w.name for w in wls})
            if unknown:
                raise SystemExit(f"--workloads: unknown {unknown}; choose from {[w.name for w in wls]}")
            wls = [w for w in wls if w.name in a.workloads]
        jobs, skipped = sweep_plan(wls, a.targets, a.kernels, a.quick)
        jobs = expand_lnc(jobs, a.lnc, a.api)
        t0, c0 = time.perf_counter(), time.process_time()
        rows, bds = run_sweep(jobs, breakdown_cases(wls) if a.breakdown else (),
                                     progress=not a.no_progress)
        doc = dict(note="all times MODELED by nki_sim.cost (not measured) except sim_seconds",
                   commit=git_commit(), code_commit=git_commit("nki_kernels", "host", "nki_sim"),
                   quick=a.quick, heads=dict(H=H, Hkv=HKV, d=128),
                   wall_seconds=time.perf_counter() - t0, cpu_seconds=time.process_time() - c0,
                   rows=rows, skipped=skipped,
                   breakdowns=bds,
                   command=command_line("bench_paged_attention.py",
                                        sys.argv[1:] if argv is None else argv))
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1))
    text = report.markdown(doc)
    print(text)
    if a.breakdown and doc.get("breakdowns"):
        print(report.breakdown_text(doc["breakdowns"]))
    if a.markdown:
        Path(a.markdown).write_text(report.markdown(doc, with_breakdown=True) + "\n")
    if a.plot:
        report.plot(doc, a.plot)
        print(f"plot: {a.plot}")
    if a.json:
        print(f"json: {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
