#!/usr/bin/env python
"""KV-cache write (reshape_and_cache): coalesced NKI kernel vs a per-token DMA kernel vs NumPy.

For each workload (T new tokens, Hkv heads, head size d, block size B, bf16 cache, a fraction of
padding slots = -1) this runs, on the nki_sim simulator with tracing:

* ``nki (128 rows/DMA)``: ``host.reshape_and_cache`` -> ``nki_kernels.cache.kv_cache_update``: any 128
  (token, head) rows per indirect store, K / V / index loads chunked; on each NKI API of
  ``--api`` (one kernel source; the current API is modeled on trn2 only), on one physical core
  (``lnc=1``, as the single-program baseline; at LNC 2 the two cores split the rows);
* ``nki, vLLM block-KV``: the same call on vLLM's layout, a (key_cache, value_cache) pair of
  (N, B, Hkv, d) caches (``host/cache/block_kv.py``): one row of Hkv * d elements per token, so one
  DMA descriptor per token and K / V instead of Hkv;
* ``per-token DMA``: ``nki_kernels.baselines.kv_write_per_token``: per token one index, K and V
  load and two indirect stores of Hkv rows;
* ``nki, host-filtered`` (padded workloads only): the alternative to DMA skip -- drop the padding
  tokens on the host, then run the same kernel on the valid tokens only;

and reports, from the simulator trace: DMA instructions (all, and indirect), DMA descriptors,
DMA bytes (all DMAs, including the loads into SBUF), and the MODELED time of the trace on trn2
from ``nki_sim.cost.estimate`` (an analytical model, not a measurement; "n/a" if the cost module
is missing). Both kernels' results are checked to be identical.

``numpy fancy-index`` is the CPU baseline: ``cache[0, blk, :, off, :] = key`` (and V) with the
valid tokens, MEASURED wall time on this machine (median of --repeats), labelled "CPU wall".
It is a different machine class than the modeled NeuronCore figures; compare kernels with
kernels, and use the CPU figure only as the host-side alternative's cost.

    python scripts/bench_cache_write.py [--repeats 7] [--api auto|legacy|nki|both] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import nki_sim  # noqa: E402
from nki_pa_cli.script_args import (add_api_arg, add_common_args, api_runs,  # noqa: E402
                                    parse_args, write_json)
from host.cache.cache_ops import cache_write_row_index, reshape_and_cache  # noqa: E402
from nki_kernels.baselines.kv_write_per_token import kv_write_per_token  # noqa: E402

try:  # the cost model is a separate part of the project; report counts only without it
    from nki_sim.cost import estimate  # noqa: E402
except ImportError:  # pragma: no cover
    estimate = None

# (label, T, Hkv, d, B, padding fraction)
WORKLOADS = [
    ("decode 32 seqs", 32, 8, 128, 32, 0.0),
    ("decode 64, 25% pad", 64, 8, 128, 32, 0.25),
    ("prefill 512", 512, 8, 128, 32, 0.0),
    ("prefill 2048", 2048, 8, 128, 32, 0.0),
    ("MQA prefill 512", 512, 1, 128, 32, 0.0),
]
DTYPE = ml_dtypes.bfloat16


def make_inputs(rng, n_tok, n_heads, d, block_size, pad):
    n_blocks = 2 * (n_tok // block_size + 1)
    cache = rng.standard_normal((2, n_blocks, n_heads, block_size, d)).astype(DTYPE)
    key = rng.standard_normal((n_tok, n_heads, d)).astype(DTYPE)
    value = rng.standard_normal((n_tok, n_heads, d)).astype(DTYPE)
    slots = rng.permutation(n_blocks * block_size)[:n_tok].astype(np.int64)
    slots[rng.random(n_tok) < pad] = -1
    return key, value, cache, slots


def trace_row(trace, api="legacy") -> dict:
    s = trace.summary()
    row = {"api": api, "dma_instructions": s["dma_instructions"],
           "dma_indirect": s["dma_indirect_instructions"], "dma_descriptors": s["dma_descriptors"],
           "dma_bytes": s["dma_bytes"]}
    for target in ("trn2", "trn1"):     # the current API supports trn2 / trn3 only
        ok = estimate is not None and (api == "legacy" or target == "trn2")
        row[f"modeled_us_{target}"] = estimate(trace, target).modeled_us if ok else None
    return row


def block_kv_pair(cache):
    """The (2, N, Hkv, B, d) cache's contents in vLLM's block-KV layout: a (key_cache,
    value_cache) pair of (N, B, Hkv, d) views of one (2, N, B, Hkv, d) buffer."""
    kv = np.ascontiguousarray(cache.transpose(0, 1, 3, 2, 4))
    return kv, (kv[0], kv[1])


def median_us(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e6


def cpu_wall_us(key, value, cache, slots, repeats):
    b = cache.shape[3]
    valid = slots >= 0
    blk, off = slots[valid] // b, slots[valid] % b
    k, v = key[valid], value[valid]

    def run():
        cache[0, blk, :, off, :] = k
        cache[1, blk, :, off, :] = v

    return median_us(run, repeats)


def bench(repeats: int, workloads=WORKLOADS, apis=("legacy", "nki")) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for label, n_tok, n_heads, d, block_size, pad in workloads:
        key, value, cache, slots = make_inputs(rng, n_tok, n_heads, d, block_size, pad)
        per_api = []
        for api in apis:
            ours = cache.copy()
            with nki_sim.use_target("trn2"), nki_sim.tracing() as t_ours:
                reshape_and_cache(key, value, ours, slots, api=api, lnc=1)
            kv, pair = block_kv_pair(cache)
            with nki_sim.use_target("trn2"), nki_sim.tracing() as t_blk:
                reshape_and_cache(key, value, pair, slots, api=api, lnc=1)
            if kv.tobytes() != block_kv_pair(ours)[0].tobytes():
                raise AssertionError(f"{label}: the block-KV write disagrees ({api})")
            per_api.append((api, t_ours, t_blk))
        theirs = cache.copy()
        idx = cache_write_row_index(slots, num_blocks=cache.shape[1], num_kv_heads=n_heads,
                                    block_size=block_size).reshape(n_tok, n_heads, 1)
        with nki_sim.tracing() as t_tok:
            kv_write_per_token(key, value, theirs, idx)
        cpu = cache.copy()
        wall = cpu_wall_us(key, value, cpu, slots, repeats)
        if not (ours.tobytes() == theirs.tobytes() == cpu.tobytes()):
            raise AssertionError(f"{label}: the three implementations disagree")
        base = {"workload": label, "T": n_tok, "Hkv": n_heads, "d": d, "B": block_size,
                "padding": pad, "rows": n_tok * n_heads}
        for api, t_ours, t_blk in per_api:
            rows.append({**base, "variant": "nki (128 rows/DMA)", **trace_row(t_ours, api),
                         "cpu_wall_us": None})
            rows.append({**base, "variant": "nki, vLLM block-KV (N, B, Hkv, d)",
                         **trace_row(t_blk, api), "cpu_wall_us": None})
        rows.append({**base, "variant": "per-token DMA", **trace_row(t_tok), "cpu_wall_us": None})
        if pad > 0:  # the alternative to DMA skip: compact on the host, write only valid tokens
            keep = slots >= 0
            filtered = cache.copy()
            with nki_sim.tracing() as t_filt:
                reshape_and_cache(key[keep], value[keep], filtered, slots[keep], api="legacy")
            if filtered.tobytes() != ours.tobytes():
                raise AssertionError(f"{label}: host filtering disagrees")
            compact = median_us(lambda: (key[keep], value[keep], slots[keep]), repeats)
            rows.append({**base, "variant": "nki, host-filtered (+ host compaction)", **trace_row(t_filt),
                         "cpu_wall_us": compact})
        rows.append({**base, "variant": "numpy fancy-index (CPU)", "api": None, "dma_instructions": None,
                     "dma_indirect": None, "dma_descriptors": None, "dma_bytes": None,
                     "modeled_us_trn2": None, "modeled_us_trn1": None, "cpu_wall_us": wall})
    return rows


def fmt(x, spec=""):
    return "-" if x is None else format(x, spec)


def markdown(rows: list[dict]) -> str:
    head = ("| workload (T x Hkv, d=128, bf16) | variant | API | DMA instr | indirect | descriptors "
            "| DMA bytes | modeled trn2 us | modeled trn1 us | CPU wall us |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['workload']} ({r['T']}x{r['Hkv']}) | {r['variant']} | {fmt(r['api'])} "
                     f"| {fmt(r['dma_instructions'])} "
                     f"| {fmt(r['dma_indirect'])} | {fmt(r['dma_descriptors'])} | {fmt(r['dma_bytes'])} "
                     f"| {fmt(r['modeled_us_trn2'], '.2f')} | {fmt(r['modeled_us_trn1'], '.2f')} "
                     f"| {fmt(r['cpu_wall_us'], '.1f')} |")
    note = ("\nmodeled = nki_sim.cost.estimate on the simulator trace (analytical model, not a measurement); "
            "CPU wall = measured on this host (median): the NumPy fancy-index write, or for the host-filtered "
            "row the boolean compaction of key / value / slots it needs (on Trainium the filtered kernel "
            "would also recompile for every distinct number of valid tokens).")
    if estimate is None:
        note = "\nnki_sim.cost is not available: DMA counts only." + note
    return "\n".join(lines) + note


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="CPU timing repeats (median)")
    add_api_arg(ap, default="both", what="the product kernel rows (the baselines are legacy)")
    add_common_args(ap, quick_help="only the two decode workloads (smoke test)")
    args = parse_args(ap, argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1; got {args.repeats}")
    apis = tuple(a for _, a in api_runs(args.api, ["trn2"]))       # traces are simulated for trn2
    rows = bench(args.repeats, WORKLOADS[:2] if args.quick else WORKLOADS, apis)
    print(markdown(rows))
    write_json(args, __file__, rows, cost_model=estimate is not None, dtype="bfloat16")
    return 0

if __name__ == "__main__":
    sys.exit(main())
