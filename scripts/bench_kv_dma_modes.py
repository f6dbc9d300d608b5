#!/usr/bin/env python
"""MODELED cost of the ways the current NKI API can bring cached KV rows on chip (trn2).

The scheduled kernel brings a load of 128 cache blocks of one KV head (one row of ``R`` elements
per block and partition: ``B x d`` = 32 x 128 bf16 = 8 KiB at the benchmark's shapes) with ONE
indirect DMA whose row ids come from the block table (``vector_offset``: a gather, which only
software DGE can do, descriptors generated on GpSimd). The current API also offers direct DMAs
whose start is a runtime value (``.ap(scalar_offset=...)``) on hardware DGE (NeuronCore-v3+, no
GpSimd work, about 600 ns per instruction). This script runs the same loads each way on nki_sim
and models them with ``nki_sim.cost`` (docs/cost-model.md; nothing is measured):

* ``gather``: the kernel's way, one swdge ``dma_copy`` of 128 rows per load;
* ``per block``: 128 hwdge ``dma_copy`` with ``scalar_offset`` per load, one per block (the way
  nki-library's segmented prefill kernel brings V);
* ``runs of k``: 128 / k hwdge ``dma_copy`` with ``scalar_offset`` per load, each of k blocks
  whose ids are consecutive (valid only where the block table has such runs; k = 16, 128).

Every mode loads the same blocks (ids in runs of 128, so every mode applies) and the script stops
unless all of them bring exactly the cache's rows. Reported per load of 128 blocks (the trace of
16 loads, 4 with ``--quick``, divided by their number): DMA time (the model's DMA resource: the
largest of the busiest of the 16 DMA engines, the latency bound of the instructions in flight
and the HBM share), its latency bound and busiest engine, GpSimd time (descriptor generation),
modeled time and DMA instructions.

Result (docs/bench-kv-dma-modes.md): one DMA per block is latency-bound (about 20x the gather
per load), runs of 16 about 3x; only runs of 128 consecutive blocks match the gather, saving
its GpSimd descriptor work.

    python scripts/bench_kv_dma_modes.py [--quick] [--json PATH] [--markdown PATH]
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

P = 128
MODES = ("gather", "per block", "runs of 16", "runs of 128")


def run_length(mode: str) -> int:
    """Blocks per DMA instruction of ``mode`` (the gather: 128 rows in one indirect DMA)."""
    return {"gather": P, "per block": 1}.get(mode) or int(mode.rsplit(" ", 1)[1])


def make_kernel(mode: str, loads: int, head: int):
    """A current-API kernel bringing ``loads`` loads of 128 blocks of KV head ``head`` in
    ``mode`` and storing them: ``kernel(cache (N, Hkv, R), ids_col (128, loads) int32,
    ids_row (1, 128 * loads) int32) -> (loads * 128, R)`` (row ``l * 128 + p`` =
    ``cache[ids_col[p, l], head]``; ``ids_row[0, l * 128 + p]`` = the same id)."""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    k = run_length(mode)

    def kernel(cache, ids_col, ids_row):
        N, Hkv, R = cache.shape
        out = nl.ndarray((loads * P, R), cache.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((P, loads), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=ids_col)
        ids = nl.ndarray((1, loads * P), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ids, src=ids_row)
        for t in range(loads):
            rows = nl.ndarray((P, R), cache.dtype, buffer=nl.sbuf)
            if mode == "gather":
                src = cache.ap([[Hkv * R, P], [1, R]], offset=head * R,
                               vector_offset=idx[0:P, t:t + 1], indirect_dim=0)
                nisa.dma_copy(dst=rows, src=src, oob_mode=nisa.oob_mode.skip,
                              dge_mode=nisa.dge_mode.swdge, name="kv")
            else:
                for j in range(0, P, k):
                    first = ids.ap([[loads * P, 1], [1, 1]], offset=t * P + j)
                    src = cache.ap([[Hkv * R, k], [1, R]], offset=head * R, scalar_offset=first,
                                   indirect_dim=0)
                    nisa.dma_copy(dst=rows[j:j + k, 0:R], src=src,
                                  dge_mode=nisa.dge_mode.hwdge, name="kv")
            nisa.dma_copy(dst=out[t * P:(t + 1) * P, 0:R], src=rows)
        return out

    return nki.jit(kernel)


def block_ids(n_blocks: int, loads: int, seed: int) -> np.ndarray:
    """(loads * 128,) distinct block ids in runs of 128 consecutive ids (seeded run starts)."""
    rng = np.random.default_rng(seed)
    starts = rng.permutation(n_blocks // P)[:loads] * P
    return (starts[:, None] + np.arange(P)[None, :]).reshape(-1).astype(np.int32)


def measure(mode: str, loads: int, *, Hkv=8, B=32, d=128, seed=0) -> dict:
    """Run ``loads`` loads in ``mode`` on nki_sim (trn2), check the rows, model the KV DMAs."""
    import ml_dtypes

    import nki_sim
    from nki_sim import cost

    nki_sim.install()
    R = B * d
    n_blocks = 2 * loads * P
    rng = np.random.default_rng(seed)
    cache = rng.standard_normal((n_blocks, Hkv, R), dtype=np.float32).astype(ml_dtypes.bfloat16)
    ids = block_ids(n_blocks, loads, seed)
    head = Hkv - 1
    kernel = make_kernel(mode, loads, head)
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
        out = kernel(cache, np.ascontiguousarray(ids.reshape(loads, P).T), ids.reshape(1, -1))
    if not np.array_equal(np.asarray(out), cache[ids, head]):
        raise SystemExit(f"{mode}: the loaded rows differ from the cache's")
    kv = [e for e in trace.events if e.name == "kv"]
    rep = cost.estimate(kv, "trn2")
    per = 1.0 / loads
    return {"mode": mode, "blocks_per_dma": run_length(mode), "loads": loads,
            "row_bytes": R * 2, "dma_instructions_per_load": len(kv) * per,
            "dma_us": rep.per_engine_us["dma"] * per,
            "dma_queue_us": rep.dma_queue_us * per, "dma_engine_max_us": rep.dma_engine_max_us * per,
            "gpsimd_us": rep.per_engine_us["gpsimd"] * per, "modeled_us": rep.modeled_us * per}


def table(rows: list) -> str:
    head = ("| mode | blocks per DMA | DMAs per load | DMA us | latency bound us | "
            "busiest DMA engine us | GpSimd us | modeled us | vs gather |")
    out = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = next(r["modeled_us"] for r in rows if r["mode"] == "gather")
    for r in rows:
        out.append(f"| {r['mode']} | {r['blocks_per_dma']} | {r['dma_instructions_per_load']:.0f} | "
                   f"{r['dma_us']:.2f} | {r['dma_queue_us']:.2f} | {r['dma_engine_max_us']:.2f} | "
                   f"{r['gpsimd_us']:.2f} | {r['modeled_us']:.2f} | "
                   f"{r['modeled_us'] / base:.2f}x |")
    return "\n".join(out)


def markdown(rows: list, cmd: str, commit: str) -> str:
    from nki_sim.cost_constants import TRN2

    per_block = next(r for r in rows if r["mode"] == "per block")
    at16 = per_block["dma_queue_us"] * TRN2.dma_inflight / 16
    return "\n".join([
        "# KV loads on the current API: gather vs scalar-offset DMAs (MODELED, trn2)", "",
        f"Generated by `{cmd}` at commit {commit}; every figure is MODELED by `nki_sim.cost` (docs/cost-model.md), per load "
        f"of 128 cache blocks of one KV head ({rows[0]['row_bytes']} B per block: B = 32, d = 128, "
        f"bf16), averaged over {rows[0]['loads']} loads. The modes are described in the script's "
        "docstring; all bring the same rows.", "",
        table(rows), "",
        "DMA us is the model's DMA resource: the larger of the busiest of the 16 DMA engines (the "
        "bytes and descriptors) and the latency bound (each instruction's ~1.3 us setup, ~0.6 us "
        "more on hardware DGE, and its transfer, with four instructions in flight). The bytes "
        "are the same in "
        "every mode; what changes is the instruction count and who makes the descriptors. The "
        f"number in flight is an estimate (`nki_sim.cost_constants` `dma_inflight` = "
        f"{TRN2.dma_inflight:g}); with 16 in flight the per-block loads would still take "
        f"{at16:.1f} us each, {at16 / rows[0]['dma_us']:.1f}x the gather.", ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, quick_help="4 loads instead of 16")
    add_markdown_arg(ap)
    args = parse_args(ap, argv)
    loads = 4 if args.quick else 16
    rows = []
    for mode in MODES:
        t0 = time.perf_counter()
        rows.append(measure(mode, loads))
        print(f"{mode}: {rows[-1]['modeled_us']:.2f} us per load (MODELED), "
              f"sim {time.perf_counter() - t0:.1f} s", flush=True)
    print(table(rows))
    write_json(args, __file__, rows, commit=git_commit())
    write_markdown(args, __file__, argv, lambda cmd, commit: markdown(rows, cmd, commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
