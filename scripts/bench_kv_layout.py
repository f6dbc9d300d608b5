#!/usr/bin/env python
"""MODELED cost of the two KV-cache layouts in the scheduled paged-attention kernel.

For each workload (a decode batch and a mixed batch of scripts/_pa_workloads.py: H=32, Hkv=8,
d=128, bf16 queries and cache, mixed precision, block size 32, LARGE_TILE_SZ=2048) and each
(target, API) of ``--targets`` / ``--api`` (nki_pa_cli.script_args; default auto: trn1 legacy,
trn2 the current nki API; one core), the same batch runs twice on nki_sim under tracing through
``host.paged_attention``:

* ``fused``: one (2, N, Hkv, B, d) cache (a gathered row = b' contiguous tokens of one KV head);
* ``block_kv``: vLLM's (key_cache, value_cache) pair of (N, B, Hkv, d) caches, read in place
  (docs/layouts.md §18; a row's b' tokens of one head lie Hkv*d elements apart).

The two outputs must be identical (the script stops otherwise). Reported per row, from the trace
and ``nki_sim.cost.estimate`` (an analytical model, docs/cost-model.md; nothing is measured):
modeled time, DMA instructions and descriptors (the model's count: a DMA transpose counts one
per partition), GpSimd time (software descriptor generation of the indirect DMAs, plus the
kernel's own GpSimd work), the busiest DMA engine and DMA bytes.

    python scripts/bench_kv_layout.py [--api auto|legacy|nki|both] [--targets trn1 trn2]
                                      [--quick] [--json out.json]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402

from nki_pa_cli.script_args import (add_api_arg, add_common_args, api_runs,  # noqa: E402
                                   check_api_targets, parse_args, write_json)
from _pa_workloads import Workload, make_batch, make_workloads  # noqa: E402

BLOCK = 32
LARGE_TILE = 2048
TARGETS = ("trn1", "trn2")
LAYOUTS = ("fused", "block_kv")


def workloads(quick: bool) -> list[Workload]:
    """Full: decode_32 (32 x 2K-8K context) and mixed_2x+30 (chunks of 384 and 256 tokens + 30
    decodes); quick: decode_8 and mixed_1x128+6 (scripts/_pa_workloads.make_workloads)."""
    ws = make_workloads(quick)
    want = ("decode_8", "mixed_1x128+6") if quick else ("decode_32", "mixed_2x+30")
    return [w for w in ws if w.name in want]


def block_kv_pair(kv_cache: np.ndarray) -> tuple:
    """The fused cache's contents as vLLM hands them over: (key_cache, value_cache) views of one
    (2, N, B, Hkv, d) buffer (the per-layer tensor unbound)."""
    both = np.ascontiguousarray(kv_cache.transpose(0, 1, 3, 2, 4))
    return both[0], both[1]


def run(batch: dict, cache, target: str, api: str):
    import nki_sim
    from host.attention import paged_attention

    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        out = paged_attention(batch["query"], batch["key"], batch["value"], cache,
                              batch["block_tables"], batch["query_lens"], batch["context_lens"],
                              backend="sim", large_tile_size=LARGE_TILE, api=api, lnc=1)
    return out, trace


def row(w: Workload, target: str, api: str, layout: str, trace) -> dict:
    from nki_sim.cost import estimate

    rep = estimate(trace, target)
    return {"workload": w.name, "target": target, "api": api, "layout": layout,
            "modeled_us": rep.modeled_us, "dma_instructions": rep.dma_instructions,
            "dma_descriptors": rep.dma_descriptors, "dma_bytes": rep.dma_bytes,
            "gpsimd_us": rep.per_engine_us["gpsimd"], "dma_engine_max_us": rep.dma_engine_max_us,
            "dma_us": rep.per_engine_us["dma"]}


def bench(ws: list[Workload], runs=None, **geometry) -> list[dict]:
    """Rows of every (workload, (target, api) of ``runs``, layout); ``runs`` default
    ``api_runs("auto", TARGETS)``; ``geometry``: ``make_batch``'s heads / kv_heads / head_size
    (default the benchmark's H=32, Hkv=8, d=128)."""
    rows = []
    for w in ws:
        batch = make_batch(w, BLOCK, **geometry)
        pair = block_kv_pair(batch["kv_cache"])
        for target, api in runs or api_runs("auto", TARGETS):
            outs = {}
            for layout, cache in (("fused", batch["kv_cache"]), ("block_kv", pair)):
                outs[layout], trace = run(batch, cache, target, api)
                rows.append(row(w, target, api, layout, trace))
            if outs["fused"].tobytes() != outs["block_kv"].tobytes():
                raise AssertionError(f"{w.name} {target} {api}: the layouts' outputs differ")
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| workload | target (API) | layout | MODELED us | DMA instr | DMA descriptors "
             "| GpSimd us | busiest DMA engine us | vs fused |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    fused = {(r["workload"], r["target"], r["api"]): r for r in rows if r["layout"] == "fused"}
    for r in rows:
        base = fused[(r["workload"], r["target"], r["api"])]
        lines.append(f"| {r['workload']} | {r['target']} ({r['api']}) | {r['layout']} "
                     f"| {r['modeled_us']:.1f} | {r['dma_instructions']} | {r['dma_descriptors']} "
                     f"| {r['gpsimd_us']:.1f} | {r['dma_engine_max_us']:.1f} "
                     f"| {r['modeled_us'] / base['modeled_us']:.3f}x |")
    return "\n".join(lines) + ("\n\nMODELED (nki_sim.cost.estimate on the simulator trace); "
                               "nothing here is measured on hardware.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, quick_help="decode_8 and mixed_1x128+6 only (about a minute)")
    add_api_arg(ap, default="auto")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS),
                    help="simulated targets (default trn1 trn2)")
    args = parse_args(ap, argv)
    check_api_targets(ap, args.api, args.targets)
    rows = bench(workloads(args.quick), api_runs(args.api, args.targets))
    print(markdown(rows))
    write_json(args, __file__, rows, block_size=BLOCK, large_tile_size=LARGE_TILE,
               dtype="bfloat16", modeled=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
