#!/usr/bin/env python
"""MODELED what-ifs of the scheduled kernel's static item counts and phases.

The same kernels on the same batches as scripts/bench_paged_attention.py (H=32, Hkv=8, d=128,
bf16, block 32, LNC 1; trn1 on the legacy API, trn2 on the current API), each run with the
host schedule as shipped and with one alternative of ``host.scheduled.schedule`` swapped in for
the run (the kernel source never changes; only the schedule it is given does):

* ``no fill``: the partial phase's padding slots stay empty
  (``schedule_items.fill_partial_padding`` off);
* ``unpadded``: every phase runs exactly its real items (``bucket(n) = n``): the most a runtime
  trip count could save before it pays for its loop;
* ``fori 8``: the current API's ``nl.fori_loop`` over metadata chunks of 8 items for every
  phase of more than 8 items: such a phase padded to a multiple of 8 (not a bucket), plus the
  documented scheduling barrier of each iteration (``nki_sim.cost_constants``
  ``fori_iteration_ns``, about 9 us, added serially per chunk, KV head and phase -- an
  estimate: the kernel keeps its static loop); smaller phases keep their static bucket;
* ``one phase``: a prefill (query-rows) class runs its full tiles as masked items of the partial
  geometry, so no group's state goes through HBM between the phases.

Every time is MODELED by ``nki_sim.cost`` (docs/cost-model.md); efficiency = useful-work
roofline / modeled time, as in bench_paged_attention.py.

    python scripts/bench_schedule_whatif.py --quick
    python scripts/bench_schedule_whatif.py --json out/bench/whatif.json \\
        --markdown docs/bench-schedule-whatif.md
"""
from __future__ import annotations

import argparse
import math
import contextlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from nki_pa_cli.script_args import (add_common_args, add_markdown_arg,  # noqa: E402
                                    parse_args, write_json, write_markdown)

VARIANTS = ("shipped", "no fill", "unpadded", "fori 8", "one phase")
TARGETS = {"trn1": "legacy", "trn2": "nki"}
WORKLOADS = ("decode_32", "mixed_2x+30", "mixed_4x512+60", "prefill_2k_on_2k")
FORI_CHUNK = 8


@contextlib.contextmanager
def variant(name: str):
    """The host schedule with alternative ``name`` swapped in (restored on exit)."""
    import host.scheduled.schedule as sched
    import host.scheduled.schedule_items as items
    from nki_kernels.contract import decode_layout

    saved = {(m, a): getattr(m, a) for m in (sched, items)
             for a in ("bucket", "fill_partial_padding") if hasattr(m, a)}
    saved[(sched, "_class_schedule")] = sched._class_schedule
    try:
        if name == "no fill":
            items.fill_partial_padding = lambda full, part, per_tile: (full, part)
        elif name == "unpadded":
            for m in (sched, items):
                m.bucket = int
        elif name == "fori 8":
            static = saved[(sched, "bucket")]
            for m in (sched, items):
                m.bucket = lambda n: (static(n) if n <= FORI_CHUNK
                                      else -(-int(n) // FORI_CHUNK) * FORI_CHUNK)
        elif name == "one phase":
            real = saved[(sched, "_class_schedule")]

            def one_phase(kind, rows, blocks, qb, **kw):
                if not decode_layout(rows, blocks):
                    items.fill_partial_padding = lambda full, part, per_tile: (
                        [], sorted(part + [(g, k * per_tile + u) for g, k in full
                                           for u in range(per_tile)]))
                try:
                    return real(kind, rows, blocks, qb, **kw)
                finally:
                    items.fill_partial_padding = saved[(items, "fill_partial_padding")]
            sched._class_schedule = one_phase
        elif name != "shipped":
            raise ValueError(f"variant must be one of {VARIANTS}; got {name!r}")
        yield
    finally:
        for (m, a), v in saved.items():
            setattr(m, a, v)


def run_one(w, target: str, name: str) -> dict:
    """One (workload, target, variant) row: modeled us, efficiency, the phases' item counts."""
    import _pa_runs as runs
    import _pa_workloads as wl
    from nki_sim.cost_constants import API

    with variant(name):
        _, trace, sec, meta = runs.simulate("scheduled", wl.make_batch(w, 32), target,
                                            api=TARGETS[target], lnc=1)
    row = runs.make_row(w, 32, target, "scheduled", trace, sec, meta, api=TARGETS[target])
    barrier_us = 0.0
    if name == "fori 8":          # one barrier per chunk iteration, per KV head and phase
        chunks = sum(n // FORI_CHUNK for _, n in meta["items"].values() if n > FORI_CHUNK)
        barrier_us = chunks * wl.HKV * API.fori_iteration_ns / 1e3
    modeled = row["modeled_us"] + barrier_us
    return dict(workload=w.name, target=target, api=TARGETS[target], variant=name,
                modeled_us=modeled, barrier_us=barrier_us,
                efficiency=row["useful_roofline_us"] / modeled,
                items={k: list(v) for k, v in meta["items"].items()}, sim_seconds=sec)


def bench(quick: bool, targets) -> list:
    import _pa_workloads as wl
    ws = wl.make_workloads(quick)
    if not quick:
        ws = [w for w in ws if w.name in WORKLOADS]
    return [run_one(w, t, v) for w in ws for t in targets for v in VARIANTS]


def table(rows: list) -> str:
    base = {(r["workload"], r["target"]): r["modeled_us"] for r in rows
            if r["variant"] == "shipped"}
    out = ["| workload | target (API) | " + " | ".join(VARIANTS) + " |",
           "|---|---|" + "---:|" * len(VARIANTS)]
    keys = list(dict.fromkeys((r["workload"], r["target"]) for r in rows))
    for key in keys:
        cells = []
        for v in VARIANTS:
            r = next(r for r in rows if (r["workload"], r["target"]) == key and r["variant"] == v)
            ratio = r["modeled_us"] / base[key]
            eff = math.floor(r["efficiency"] * 1000) / 1000    # down: 0.7997 is below 0.80
            cells.append(f"{r['modeled_us']:.0f} ({eff:.3f}; {ratio:.3f}x)")
        out.append(f"| {key[0]} | {key[1]} ({TARGETS[key[1]]}) | " + " | ".join(cells) + " |")
    return "\n".join(out)


def markdown(rows: list, quick: bool, cmd: str, commit: str) -> str:
    return "\n".join([
        "# Schedule what-ifs: static buckets, padding slots, runtime trip counts, one phase "
        "(MODELED)", "",
        f"Generated by `{cmd}` at commit {commit}{' (--quick)' if quick else ''}. Every time is "
        "**modeled** by `nki_sim.cost` from exact simulator counts; nothing was measured on "
        "hardware. Each cell: modeled us (efficiency = useful-work roofline / modeled, rounded "
        "down to three decimals; time / the shipped schedule's). The variants are described in the script's docstring "
        "(`scripts/bench_schedule_whatif.py`); `fori 8` adds the documented per-iteration "
        "barrier to a static run, an estimate.", "",
        table(rows), ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, quick_help="the two small batches of bench_paged_attention --quick "
                                   "(about a minute)")
    add_markdown_arg(ap)
    ap.add_argument("--targets", nargs="+", choices=tuple(TARGETS), default=list(TARGETS))
    a = parse_args(ap, argv)
    t0 = time.perf_counter()
    rows = bench(a.quick, a.targets)
    print(table(rows))
    print(f"(simulation wall time {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    write_json(a, __file__, rows, times="MODELED")
    write_markdown(a, __file__, argv, lambda cmd, commit: markdown(rows, a.quick, cmd, commit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
