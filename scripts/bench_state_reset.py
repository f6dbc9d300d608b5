#!/usr/bin/env python
"""MODELED: how the scheduled kernel resets a group's state -- a VectorE select or a DMA.

A prefill-only launch on NeuronCore-v3+ may reset each group's fp32 state by a gather from a
table of the initial rows instead of a VectorE select over the whole state
(``nki_kernels.scheduled.sched_item.reset_by_dma``, a trace-time rule of the target, the API
and the launch's shapes). This script runs prefill-only batches (chunked prefills on context,
causal prefills, sliding windows; H=32 / Hkv=8 and H=4 / Hkv=1, d=128, bf16, mixed
precision, block 32, large_tile_size="auto", LNC 1) through ``host.paged_attention`` on
nki_sim twice -- as the rule picks and with the other reset forced -- on trn2's current and
legacy APIs and on trn1, and reports both modeled times, the rule's pick and the schedule's
shape behind it. The script stops unless the two outputs of a batch agree to the bit (both
resets write the same rows).

    python scripts/bench_state_reset.py --quick
    python scripts/bench_state_reset.py --json out/bench/state_reset.json \\
        --markdown docs/bench-state-reset.md
"""
from __future__ import annotations

import argparse
import contextlib
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

TARGETS = (("trn2", "nki"), ("trn2", "legacy"), ("trn1", "legacy"))
# (name, new tokens, cached tokens, sliding window or None, KV heads) per batch; H = 4 * Hkv
FULL = (("2K on 2K", (2048,), (2048,), None, 8),
        ("1536 on 4096", (1536,), (4096,), None, 8),
        ("1K on 4K", (1024,), (4096,), None, 8),
        ("2K on 1K", (2048,), (1024,), None, 8),
        ("640 on 6K", (640,), (6144,), None, 8),
        ("768 on 3K", (768,), (3072,), None, 8),
        ("512 on 4K", (512,), (4096,), None, 8),
        ("2 x 512 on 2K", (512, 512), (2048, 2048), None, 8),
        ("256 on 8K", (256,), (8192,), None, 8),
        ("8 x 128 on 2K", (128,) * 8, (2048,) * 8, None, 8),
        ("1K on 1K", (1024,), (1024,), None, 8),
        ("1536 on 1K", (1536,), (1024,), None, 8),
        ("1K on 0", (1024,), (0,), None, 8),
        ("3K on 0", (3072,), (0,), None, 8),
        ("4 x 256 on 0", (256,) * 4, (0,) * 4, None, 8),
        ("2K on 2K, window 1024", (2048,), (2048,), 1024, 8),
        ("2K on 2K, Hkv 1", (2048,), (2048,), None, 1),
        ("1K on 4K, Hkv 1", (1024,), (4096,), None, 1),
        ("256 on 8K, Hkv 1", (256,), (8192,), None, 1),
        ("1K on 0, Hkv 1", (1024,), (0,), None, 1))
QUICK = (("256 on 4K", (256,), (4096,), None, 1), ("256 on 0", (256,), (0,), None, 1))


@contextlib.contextmanager
def reset_rule(choose):
    """The kernel's reset rule replaced for the block by ``choose(ops, cfg, shipped)`` (the
    shipped rule's answer passed in; restored on exit). Returns the list of the shipped rule's
    answers, one per launch traced in the block."""
    import nki_kernels.scheduled.scheduled_attention as sa

    saved = sa.reset_by_dma
    picks = []

    def rule(ops, cfg):
        shipped = saved(ops, cfg)
        picks.append(shipped)
        return choose(ops, cfg, shipped)

    sa.reset_by_dma = rule
    try:
        yield picks
    finally:
        sa.reset_by_dma = saved


def run(case, target: str, api: str) -> dict:
    """One batch on one target with the rule's reset and the other one: modeled us, the rule's
    pick and the shape it saw (Q blocks per group; full and partial items)."""
    import _pa_runs as runs
    import _pa_workloads as wl
    import nki_sim
    from host import paged_attention
    from nki_sim import cost

    name, q, c, window, hkv = case
    batch = wl.make_batch(wl.Workload(name=name, kind="prefill", query_lens=q, context_lens=c),
                          32, heads=4 * hkv, kv_heads=hkv)
    extra = {} if window is None else dict(sliding_window=window)
    row = dict(batch=name, target=target, api=api, window=window, kv_heads=hkv)
    outs = {}
    for key, choose in (("shipped", lambda ops, cfg, s: s),
                        ("other", lambda ops, cfg, s: not s)):
        with reset_rule(choose) as picks, nki_sim.use_target(target), \
                nki_sim.tracing() as trace, runs.captured_schedules() as seen:
            outs[key] = np.asarray(paged_attention(
                **batch, kernel="scheduled", backend="sim", mixed_precision=True,
                large_tile_size="auto", api=api, lnc=1, **extra), np.float32)
        row[key] = dict(modeled_us=cost.estimate(trace, target).modeled_us,
                        dma=[bool(p) != (key == "other") for p in picks])
        row["shape"] = [dict(blocks=k.blocks, full=k.full.real_items,
                             partial=k.partial.real_items) for s in seen for k in s.classes]
    if not np.array_equal(outs["shipped"], outs["other"]):
        raise SystemExit(f"{name} on {target} ({api}): the two resets' outputs differ")
    dma = row["shipped"]["dma"]
    if not dma:
        raise SystemExit(f"{name} on {target} ({api}): the kernel never asked the reset rule")
    row["pick"] = "DMA" if all(dma) else "select" if not any(dma) else "both"
    row["pick_over_best"] = row["shipped"]["modeled_us"] / min(row["shipped"]["modeled_us"],
                                                               row["other"]["modeled_us"])
    return row


def _times(r: dict) -> tuple:
    """(select us, DMA us) of a row."""
    s, o = r["shipped"]["modeled_us"], r["other"]["modeled_us"]
    return (o, s) if r["pick"] == "DMA" else (s, o)


def table(rows: list) -> str:
    out = ["| batch | target (API) | Q blocks per group; full / partial items | select us | "
           "DMA us | rule picks | picked / faster |", "|---|---|---|---:|---:|---|---:|"]
    for r in rows:
        shape = "; ".join(f"{k['blocks']}; {k['full']} / {k['partial']}" for k in r["shape"])
        sel, dma = _times(r)
        out.append(f"| {r['batch']} | {r['target']} ({r['api']}) | {shape} | {sel:.1f} | "
                   f"{dma:.1f} | {r['pick']} | {r['pick_over_best']:.3f} |")
    return "\n".join(out)


def markdown(rows: list, cmd: str, commit: str) -> str:
    best = sum(r["pick_over_best"] == 1.0 for r in rows)
    worst = max(r["pick_over_best"] for r in rows)
    return "\n".join([
        "# Group-state reset: a VectorE select or a DMA (MODELED)", "",
        f"Generated by `{cmd}` at commit {commit}; every figure is MODELED by `nki_sim.cost` "
        "(docs/cost-model.md), nothing ran on hardware. Prefill-only batches, H = 4 x Hkv, "
        "d = 128, bf16, block 32, `large_tile_size=\"auto\"`, one core. Each batch runs with "
        "the reset `sched_item.reset_by_dma` picks and with the other one forced; the outputs "
        "agree to the bit. The select costs VectorE one pass over the group's state "
        "(Q blocks x (d + 2) fp32 columns per row) per item; the DMA costs a gather per item "
        "(skipped, no bytes, unless the group starts) and the whole state per group start on "
        "the DMA queues. The rule: NeuronCore-v3+, no decode class, a full phase, and on the "
        "current API (K^T by DMA transposes) groups of at least "
        "`RESET_BY_DMA_MIN_BLOCKS` Q blocks.", "",
        table(rows), "",
        f"The rule picks the faster reset in {best} of {len(rows)} runs; where it does not, "
        f"its pick costs at most {100 * (worst - 1):.1f} % more.", ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, quick_help="two small batches (256 on 4K; 256 on 0; Hkv 1)")
    add_markdown_arg(ap)
    args = parse_args(ap, argv)
    rows = []
    for case in (QUICK if args.quick else FULL):
        for target, api in TARGETS:
            t0 = time.perf_counter()
            r = run(case, target, api)
            rows.append(r)
            sel, dma = _times(r)
            print(f"{r['batch']} {target} ({api}): select {sel:.1f} us, DMA {dma:.1f} us, "
                  f"rule picks {r['pick']} ({r['pick_over_best']:.3f}x the faster; MODELED), "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    print(table(rows))
    write_json(args, __file__, rows, commit=git_commit())
    write_markdown(args, __file__, argv, lambda cmd, commit: markdown(rows, cmd, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
