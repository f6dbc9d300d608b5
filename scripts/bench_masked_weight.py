#!/usr/bin/env python
"""MODELED: the masked-key weight of ``partial_tile_size="auto"`` on batches it was not fitted on.

``host.scheduled.schedule_items.MASKED_KEY_WEIGHT`` (1.25) makes the host's group-size and
partial-tile choice count a prefill class's masked keys as 1.25 keys: it was fitted on the cost
model with the batches of scripts/bench_paged_attention.py. This script runs held-out batches
(chunked prefills on context, several causal prefills, sliding windows, a prefill beside
decodes; H=32, Hkv=8, d=128, bf16, mixed precision, block 32, large_tile_size="auto", LNC 1)
through ``host.paged_attention`` on nki_sim with the weight as shipped and with 1 (every key
alike), on trn2's current API and trn1's legacy API, and reports both modeled times and the
choices behind them. The script stops unless the two outputs of a batch agree within the bf16
tolerance.

    python scripts/bench_masked_weight.py --quick
    python scripts/bench_masked_weight.py --json out/bench/masked_weight.json \\
        --markdown docs/bench-masked-weight.md
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402

from nki_pa_cli.script_args import (add_common_args, add_markdown_arg,  # noqa: E402
                                    git_commit, parse_args, write_json, write_markdown)

TARGETS = (("trn2", "nki"), ("trn1", "legacy"))
ATOL = 3e-2                  # bf16 mixed precision: one weight's output against the other's
# (name, new tokens, cached tokens, sliding window or None) per batch
FULL = (("512 on 1536", (512,), (1536,), None),
        ("1K on 1K", (1024,), (1024,), None),
        ("3K on 0", (3072,), (0,), None),
        ("2 x 768 on 0", (768, 768), (0, 0), None),
        ("1536 on 4096", (1536,), (4096,), None),
        ("4 x 256 on 0", (256,) * 4, (0,) * 4, None),
        ("1K on 0, window 512", (1024,), (0,), 512),
        ("2K on 2K, window 1024", (2048,), (2048,), 1024),
        ("1K on 0 + 16 decodes", (1024,) + (1,) * 16,
         (0,) + tuple(range(2000, 2000 + 16 * 150, 150)), None))
QUICK = (("256 on 0", (256,), (0,), None), ("128 on 128, window 64", (128,), (128,), 64))


@contextlib.contextmanager
def masked_key_weight(weight: float):
    """The host's masked-key weight set to ``weight`` for the block (restored on exit)."""
    import host.scheduled.schedule_items as items

    with mock.patch.object(items, "MASKED_KEY_WEIGHT", weight):
        yield


def run(case, target: str, api: str) -> dict:
    """One batch on one target at both weights: modeled us and the host's choices (prefill
    group sizes; the partial tile of each launch: a batch may run as several, one per class)."""
    import _pa_runs as runs
    import _pa_workloads as wl
    import host.scheduled.schedule_items as items
    import nki_sim
    from host import paged_attention
    from nki_sim import cost

    name, q, c, window = case
    batch = wl.make_batch(wl.Workload(name=name, kind="prefill", query_lens=q, context_lens=c),
                          32)
    extra = {} if window is None else dict(sliding_window=window)
    row = dict(batch=name, target=target, api=api, window=window)
    outs = {}
    for key, weight in (("unweighted", 1.0), ("shipped", items.MASKED_KEY_WEIGHT)):
        with masked_key_weight(weight), nki_sim.use_target(target), \
                nki_sim.tracing() as trace, runs.captured_schedules() as seen:
            outs[key] = np.asarray(paged_attention(
                **batch, kernel="scheduled", backend="sim", mixed_precision=True,
                large_tile_size="auto", api=api, lnc=1, **extra), np.float32)
        row[key] = dict(weight=weight, modeled_us=cost.estimate(trace, target).modeled_us,
                        group_blocks=[k.blocks for s in seen for k in s.classes
                                      if k.kind == "prefill"],
                        partial_tile_sizes=[s.partial_tile_size for s in seen])
    err = float(np.abs(outs["shipped"] - outs["unweighted"]).max())
    if not err <= ATOL:
        raise SystemExit(f"{name} on {target}: the two weights' outputs differ by {err:.3g}")
    row["ratio"] = row["shipped"]["modeled_us"] / row["unweighted"]["modeled_us"]
    return row


def _choice(r: dict) -> str:
    blocks = "/".join(str(b) for b in r["group_blocks"]) or "-"
    return f"{blocks} blocks, {'/'.join(str(t) for t in r['partial_tile_sizes'])} keys"


def table(rows: list) -> str:
    out = ["| batch | target (API) | weight 1: us (prefill groups, partial tiles) | shipped: "
           "us (prefill groups, partial tiles) | shipped / weight 1 |", "|---|---|---:|---:|---:|"]
    for r in rows:
        u, s = r["unweighted"], r["shipped"]
        out.append(f"| {r['batch']} | {r['target']} ({r['api']}) | {u['modeled_us']:.0f} "
                   f"({_choice(u)}) | {s['modeled_us']:.0f} ({_choice(s)}) | "
                   f"{r['ratio']:.3f} |")
    return "\n".join(out)


def markdown(rows: list, cmd: str, commit: str) -> str:
    same = sum(r["ratio"] == 1.0 for r in rows)
    better = sum(r["ratio"] < 1.0 for r in rows)
    worse = [r for r in rows if r["ratio"] > 1.0]
    worst = max((r["ratio"] for r in worse), default=1.0)
    return "\n".join([
        "# The masked-key weight on held-out batches (MODELED)", "",
        f"Generated by `{cmd}` at commit {commit}; every figure is MODELED by `nki_sim.cost` "
        "(docs/cost-model.md), nothing ran on hardware. H = 32, Hkv = 8, d = 128, bf16, "
        "block 32, `large_tile_size=\"auto\"`, one core. `MASKED_KEY_WEIGHT` "
        f"({rows[0]['shipped']['weight'] if rows else '-'}) counts a prefill class's masked "
        "keys in the host's choice of prefill group size and partial tile "
        "(docs/layouts.md §16); it was fitted on the batches of "
        "[bench-scheduled.md](bench-scheduled.md), none of which is below. Weight 1 counts "
        "every key alike.", "",
        table(rows), "",
        f"Of {len(rows)} runs the weight changes nothing in {same}, helps in {better} and costs "
        f"time in {len(worse)} (at most {100 * (worst - 1):.1f} %). Where it changes the "
        "choice it picks smaller prefill groups and partial tiles, which leave fewer masked "
        "keys beside a causal diagonal or a window edge and re-read each full tile once per "
        "group.", ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, quick_help="two small batches (256 on 0; 128 on 128 with a window)")
    add_markdown_arg(ap)
    args = parse_args(ap, argv)
    rows = []
    for case in (QUICK if args.quick else FULL):
        for target, api in TARGETS:
            t0 = time.perf_counter()
            r = run(case, target, api)
            rows.append(r)
            print(f"{r['batch']} {target} ({api}): weight 1 {r['unweighted']['modeled_us']:.1f} "
                  f"us, shipped {r['shipped']['modeled_us']:.1f} us ({r['ratio']:.3f}x; "
                  f"MODELED), {time.perf_counter() - t0:.0f} s", flush=True)
    print(table(rows))
    write_json(args, __file__, rows, commit=git_commit())
    write_markdown(args, __file__, argv, lambda cmd, commit: markdown(rows, cmd, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
