#!/usr/bin/env python
"""MODELED: the scheduled kernel's trace-time engine choices for prefill-only launches, each
against its alternative.

Two choices the kernel makes from the target, the API and the launch's static shapes:

* **state reset** (``nki_kernels.scheduled.sched_item.reset_by_dma``): a group's fp32 state is
  reset by a gather from a table of the initial rows, or by a VectorE select over the whole
  state. Alternative: the other one.
* **P^T copies** (``sched_item.P_EVAC_GEN3_MASKED_ONLY`` and ``P_EVAC_GEN3_MASKED_HEAVY``): on
  NeuronCore-v3, the masked steps of a launch without a full phase send one P^T PSUM copy in
  four (2048-key tiles) or in eight (1024-key tiles) to VectorE, those of a launch with at least
  as many masked keys as full ones one in eight. Alternative: every copy on ScalarE.

Each batch (chunked prefills on context, causal prefills, sliding windows; H = 4 x Hkv, d=128,
bf16, mixed precision, block 32, large_tile_size="auto", LNC 1) runs through
``host.paged_attention`` on nki_sim as shipped and with the alternative; the script stops
unless the two outputs agree to the bit (both forms compute the same values).

    python scripts/bench_prefill_choices.py --quick
    python scripts/bench_prefill_choices.py --json out/bench/prefill_choices.json \\
        --markdown docs/bench-prefill-choices.md
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

# (name, new tokens, cached tokens, sliding window or None, KV heads) per batch; H = 4 * Hkv
RESET_BATCHES = (
    ("2K on 2K", (2048,), (2048,), None, 8), ("1536 on 4096", (1536,), (4096,), None, 8),
    ("1K on 4K", (1024,), (4096,), None, 8), ("2K on 1K", (2048,), (1024,), None, 8),
    ("640 on 6K", (640,), (6144,), None, 8), ("768 on 3K", (768,), (3072,), None, 8),
    ("512 on 4K", (512,), (4096,), None, 8), ("2 x 512 on 2K", (512, 512), (2048, 2048), None, 8),
    ("256 on 8K", (256,), (8192,), None, 8), ("8 x 128 on 2K", (128,) * 8, (2048,) * 8, None, 8),
    ("1K on 1K", (1024,), (1024,), None, 8), ("1536 on 1K", (1536,), (1024,), None, 8),
    ("1K on 0", (1024,), (0,), None, 8), ("3K on 0", (3072,), (0,), None, 8),
    ("4 x 256 on 0", (256,) * 4, (0,) * 4, None, 8),
    ("2K on 2K, window 1024", (2048,), (2048,), 1024, 8),
    ("2K on 2K, Hkv 1", (2048,), (2048,), None, 1), ("1K on 4K, Hkv 1", (1024,), (4096,), None, 1),
    ("256 on 8K, Hkv 1", (256,), (8192,), None, 1), ("1K on 0, Hkv 1", (1024,), (0,), None, 1))
COPY_BATCHES = (
    ("1K on 1K", (1024,), (1024,), None, 8), ("512 on 1536", (512,), (1536,), None, 8),
    ("1536 on 512", (1536,), (512,), None, 8), ("384 on 1K", (384,), (1024,), None, 8),
    ("640 on 1K", (640,), (1024,), None, 8), ("2K on 0", (2048,), (0,), None, 8),
    ("2K on 1K", (2048,), (1024,), None, 8), ("3K on 0", (3072,), (0,), None, 8),
    ("768 on 3K", (768,), (3072,), None, 8), ("3K on 3K", (3072,), (3072,), None, 8),
    ("1536 on 3K", (1536,), (3072,), None, 8), ("1K on 2K", (1024,), (2048,), None, 8),
    ("4 x 512 on 256", (512,) * 4, (256,) * 4, None, 8), ("1K on 0", (1024,), (0,), None, 8),
    ("2K on 2K, window 1024", (2048,), (2048,), 1024, 8), ("2K on 2K", (2048,), (2048,), None, 8),
    ("1K on 1K, Hkv 1", (1024,), (1024,), None, 1), ("2K on 0, Hkv 1", (2048,), (0,), None, 1))
QUICK_RESET = (("256 on 4K", (256,), (4096,), None, 1), ("256 on 0", (256,), (0,), None, 1))
QUICK_COPY = (("512 on 1536", (512,), (1536,), None, 1),)
TARGETS = {"state reset": (("trn2", "nki"), ("trn2", "legacy"), ("trn1", "legacy")),
           "P^T copies": (("trn2", "nki"), ("trn2", "legacy"))}


@contextlib.contextmanager
def reset_rule(choose):
    """The kernel's reset rule replaced for the block by ``choose(shipped)`` (the shipped rule's
    answer passed in; restored on exit). Yields the list of the resets the
    kernel made (True: by DMA), one per launch traced in the block."""
    import nki_kernels.scheduled.scheduled_attention as sa

    shipped, made = sa.reset_by_dma, []

    def rule(*args):
        made.append(bool(choose(shipped(*args))))
        return made[-1]

    with mock.patch.object(sa, "reset_by_dma", rule):
        yield made


@contextlib.contextmanager
def p_copy_engines(table, heavy):
    """``sched_item.P_EVAC_GEN3_MASKED_ONLY`` and ``P_EVAC_GEN3_MASKED_HEAVY`` set to ``table``
    and ``heavy`` for the block (restored on exit; ``()`` and ``"scalar"``: every copy on
    ScalarE). Yields an empty list (the copies are counted in the trace)."""
    import nki_kernels.scheduled.sched_item as si

    with mock.patch.object(si, "P_EVAC_GEN3_MASKED_ONLY", table), \
            mock.patch.object(si, "P_EVAC_GEN3_MASKED_HEAVY", heavy):
        yield []


def _forms(choice: str):
    """``(shipped, alternative)``: the context managers of a choice's two forms."""
    if choice == "state reset":
        return (lambda: reset_rule(lambda s: s), lambda: reset_rule(lambda s: not s))
    import nki_kernels.scheduled.sched_item as si

    shipped = si.P_EVAC_GEN3_MASKED_ONLY, si.P_EVAC_GEN3_MASKED_HEAVY
    return lambda: p_copy_engines(*shipped), lambda: p_copy_engines((), "scalar")


def _form_name(choice: str, made: list, trace) -> str:
    """What a run did: the reset it made, or how many of the 128-partition bf16 copies out of
    PSUM (the P^T copies; on the legacy API the K^T copies too) ran on VectorE."""
    if choice == "state reset":
        if not made:
            raise SystemExit("the kernel never asked the reset rule")
        return "DMA" if all(made) else "select" if not any(made) else "both"
    copies = [e.engine for e in trace.events if e.op == "tensor_copy" and e.src_buffer == "psum"
              and e.partitions == 128 and e.out_dtype == "bfloat16"]
    n = copies.count("vector")            # P^T copies, and on the legacy API K^T copies too
    return (f"{n} of {len(copies)} bf16 PSUM copies on VectorE" if n
            else f"all {len(copies)} on ScalarE")


def run(choice: str, case, target: str, api: str) -> dict:
    """One batch on one target, the choice as shipped and its alternative: modeled us, what
    each run did and the schedule's shape (Q blocks per group; full and partial items)."""
    import _pa_runs as runs
    import _pa_workloads as wl
    import nki_sim
    from host import paged_attention
    from nki_sim import cost

    name, q, c, window, hkv = case
    batch = wl.make_batch(wl.Workload(name=name, kind="prefill", query_lens=q, context_lens=c),
                          32, heads=4 * hkv, kv_heads=hkv)
    extra = {} if window is None else dict(sliding_window=window)
    row = dict(choice=choice, batch=name, target=target, api=api, window=window, kv_heads=hkv)
    outs = {}
    for key, form in zip(("shipped", "alternative"), _forms(choice)):
        with form() as made, nki_sim.use_target(target), nki_sim.tracing() as trace, \
                runs.captured_schedules() as seen:
            outs[key] = np.asarray(paged_attention(
                **batch, kernel="scheduled", backend="sim", mixed_precision=True,
                large_tile_size="auto", api=api, lnc=1, **extra), np.float32)
        row[key] = dict(modeled_us=cost.estimate(trace, target).modeled_us,
                        form=_form_name(choice, made, trace))
        row["shape"] = [dict(blocks=k.blocks, full=k.full.real_items,
                             partial=k.partial.real_items, partial_tile=s.partial_tile_size)
                        for s in seen for k in s.classes]
    if not np.array_equal(outs["shipped"], outs["alternative"]):
        raise SystemExit(f"{choice}, {name} on {target} ({api}): the outputs differ")
    row["ratio"] = row["shipped"]["modeled_us"] / row["alternative"]["modeled_us"]
    return row


def table(rows: list) -> str:
    out = ["| batch | target (API) | Q blocks per group; full / partial items; partial tile | "
           "shipped: us (what it did) | alternative: us (what it did) | shipped / alternative |",
           "|---|---|---|---:|---:|---:|"]
    for r in rows:
        shape = "; ".join(f"{k['blocks']}; {k['full']} / {k['partial']}; {k['partial_tile']}"
                          for k in r["shape"])
        s, a = r["shipped"], r["alternative"]
        out.append(f"| {r['batch']} | {r['target']} ({r['api']}) | {shape} | "
                   f"{s['modeled_us']:.1f} ({s['form']}) | {a['modeled_us']:.1f} ({a['form']}) "
                   f"| {r['ratio']:.3f} |")
    return "\n".join(out)


def _summary(rows: list) -> str:
    faster = sum(r["ratio"] <= 1.0 for r in rows)
    worst = max(r["ratio"] for r in rows)
    best = min(r["ratio"] for r in rows)
    slower = (f"where slower, at most {100 * (worst - 1):.1f} %" if worst > 1.0
              else "never slower")
    return (f"As shipped it is at least as fast as the alternative in {faster} of {len(rows)} "
            f"runs (best {100 * (1 - best):.1f} % faster; {slower}).")


def markdown(rows: list, cmd: str, commit: str) -> str:
    parts = [
        "# Prefill-only launches: the kernel's engine choices against their alternatives "
        "(MODELED)", "",
        f"Generated by `{cmd}` at commit {commit}; every figure is MODELED by `nki_sim.cost` "
        "(docs/cost-model.md), nothing ran on hardware. Prefill-only batches, H = 4 x Hkv, "
        "d = 128, bf16, block 32, `large_tile_size=\"auto\"`, one core. Each batch runs as "
        "shipped and with the alternative forced; the outputs agree to the bit.", ""]
    text = {
        "state reset": (
            "## State reset: VectorE select or DMA", "",
            "`sched_item.reset_by_dma`: the select costs VectorE one pass over the group's state "
            "(Q blocks x (d + 2) fp32 columns per row) per item; the DMA costs a gather per item "
            "(skipped, no bytes, unless the group starts) and the whole state per group start on "
            "the DMA queues. The kernel picks the DMA only without a decode class: on "
            "NeuronCore-v3+ where the launch has a full phase and, on the current API (K^T by "
            "DMA transposes), groups of at least `RESET_BY_DMA_MIN_BLOCKS` Q blocks; on "
            "NeuronCore-v2 where it has no full phase, partial tiles of at most "
            "`RESET_BY_DMA_GEN2_MAX_KEYS` keys and at least two KV heads. The alternative is "
            "the other reset."),
        "P^T copies": (
            "## P^T copies of masked steps: some on VectorE", "",
            "`sched_item.P_EVAC_GEN3_MASKED_ONLY`: on NeuronCore-v3, a launch without a full "
            "phase puts one masked-step P^T PSUM copy in four (tiles of 2048 keys or more) or "
            "in eight (1024-key tiles) on VectorE; 512-key tiles keep every copy on ScalarE. "
            "`P_EVAC_GEN3_MASKED_HEAVY`: a launch with a full phase and at least as many "
            "masked keys as full ones (items x tile width per phase) puts one in eight on "
            "VectorE; with fewer, every copy stays on ScalarE. The alternative keeps every copy "
            "on ScalarE.")}
    for choice in TARGETS:
        sub = [r for r in rows if r["choice"] == choice]
        if sub:
            parts += [*text[choice], "", table(sub), "", _summary(sub), ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, quick_help="small batches (Hkv 1): 256 on 4K and 256 on 0 for the "
                                   "reset, 512 on 1536 for the copies")
    add_markdown_arg(ap)
    args = parse_args(ap, argv)
    batches = {"state reset": QUICK_RESET if args.quick else RESET_BATCHES,
               "P^T copies": QUICK_COPY if args.quick else COPY_BATCHES}
    rows = []
    for choice, targets in TARGETS.items():
        for case in batches[choice]:
            for target, api in targets:
                t0 = time.perf_counter()
                r = run(choice, case, target, api)
                rows.append(r)
                print(f"{choice}, {r['batch']} {target} ({api}): shipped "
                      f"{r['shipped']['modeled_us']:.1f} us ({r['shipped']['form']}), "
                      f"alternative {r['alternative']['modeled_us']:.1f} us "
                      f"({r['alternative']['form']}); {r['ratio']:.3f}x (MODELED), "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
    print(table(rows))
    write_json(args, __file__, rows, commit=git_commit())
    write_markdown(args, __file__, argv, lambda cmd, commit: markdown(rows, cmd, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
