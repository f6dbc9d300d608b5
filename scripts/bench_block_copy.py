#!/usr/bin/env python
"""Block copy (copy_blocks): per-block and per-group DMAs vs the coalesced one-launch kernel.

Workload (the NIXL seed benchmark's sweep): L layers of a bf16 cache (2, N, Hkv, B, d), a block
mapping of n blocks split into g = 1, 2, 3, 6 GROUPS. A group is a run of n/g consecutive source
block ids copied to a run of n/g consecutive destination ids (what a prefix / swap-in produces).
In the (2, N, Hkv, B, d) layout one (layer, kv half, block) slab of Hkv*B*d elements is contiguous,
and so is one (layer, kv half, group) run of n/g slabs. Every variant moves the same rows of the
same (L*2*N*n_sub, F) row view (rows of F <= 16 KiB per partition) and does one index load, one
indirect gather and one indirect scatter per batch of <= 128 rows:

* per-block:  one batch per contiguous (layer, kv, block) slab      -> 2 * L * 2 * n gather/scatter DMAs
* per-group:  one batch per contiguous (layer, kv, group) run,
              split at 128 rows                                      -> 2 * L * 2 * g * ceil(rows/128)
* coalesced per layer: the coalesced kernel launched once per layer (rows of one layer only;
              L launches -- launch overhead is not modeled)
* coalesced:  ``host.copy_blocks`` -> ``nki_kernels.cache.block_copy.copy_cache_blocks``: ONE launch, any 128
              rows of any layer / kv / group per DMA, indices of all tiles in one load
                                                                     -> 2 * ceil(L * 2 * n * n_sub / 128)

The two coalesced variants run on each NKI API of ``--api`` (nki_pa_cli.script_args; default
both: legacy and the current ``nki``; one kernel source); the per-block / per-group baseline
kernel is legacy-only. Every trace is simulated for trn2 on one physical core (``lnc=1``, as the
single-program baselines; at LNC 2 the current API's launch splits the rows between the two
cores); the current API supports trn2 / trn3 only, so its rows have no trn1 figure.

Reported from the simulator trace: gather + scatter DMA instructions, index-load DMAs, all DMA
instructions, descriptors, KV payload bytes (gather + scatter; must be equal across variants, the
script asserts it) and the MODELED trn2 time of the trace (``nki_sim.cost.estimate``; analytical,
not measured; "-" if the cost module is missing). Results of all variants are checked identical.

    python scripts/bench_block_copy.py [--layers 4] [--blocks 24] [--kv-heads 8] [--block-size 16]
                                       [--head-size 128] [--api both] [--quick] [--json out.json]

--quick: 2 layers, 6 blocks, Hkv 2, block size 8, head size 64 (the same four variants).
"""

from __future__ import annotations

import argparse
import os
import sys

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import nki_sim  # noqa: E402
from nki_pa_cli.script_args import (add_api_arg, add_common_args, api_runs,  # noqa: E402
                                    parse_args, write_json)
from host.cache.cache_ops import (allocate_kv_caches, block_copy_row_pairs, block_row_len,  # noqa: E402
                            copy_blocks)
from nki_kernels.baselines.block_copy_batched import copy_rows_batched  # noqa: E402

try:
    from nki_sim.cost import estimate  # noqa: E402
except ImportError:  # pragma: no cover
    estimate = None

GROUPS = (1, 2, 3, 6)
N_BLOCKS = 128
DTYPE = ml_dtypes.bfloat16


def group_mapping(n: int, g: int) -> np.ndarray:
    """g runs of n/g consecutive src ids -> g runs of consecutive dst ids, runs spread over the cache."""
    per = n // g
    src = np.concatenate([np.arange(per) + k * 2 * per for k in range(g)])
    dst = src + per
    return np.stack([src, dst], axis=1)


def batches(pairs: np.ndarray, n_layers: int, n: int, g: int, n_sub: int, unit: str):
    """Reorder the (L*2*n*n_sub) pairs into batches: per (layer, kv, block) or (layer, kv, group)."""
    p = pairs.reshape(n_layers * 2, n, n_sub, 2)        # block_copy_row_pairs order: (l, kv), block, j
    run = 1 if unit == "block" else n // g
    spans = p.reshape(n_layers * 2, n // run, run * n_sub, 2)
    sizes = []
    for _ in range(n_layers * 2 * (n // run)):
        left = run * n_sub
        while left > 0:
            sizes.append(min(128, left))
            left -= sizes[-1]
    return np.ascontiguousarray(spans.reshape(-1, 2)), tuple(sizes)


def summarize(trace, api: str = "legacy") -> dict:
    dma = [e for e in trace.events if e.engine == "dma"]
    ind = [e for e in dma if e.dma_kind == "indirect"]
    trn1 = estimate is not None and api == "legacy"      # the current API: trn2 / trn3 only
    return {"api": api, "gather_scatter_dmas": len(ind), "index_dmas": len(dma) - len(ind),
            "dma_instructions": len(dma), "dma_descriptors": sum(len(e.descriptor_bytes) for e in dma),
            "kv_bytes": sum(e.bytes for e in ind),
            "modeled_us_trn2": estimate(trace, "trn2").modeled_us if estimate else None,
            "modeled_us_trn1": estimate(trace, "trn1").modeled_us if trn1 else None}


VARIANTS = ("per-block", "per-group", "coalesced per layer", "coalesced")


def bench(n_layers: int, n: int, hkv: int = 8, block: int = 16, head: int = 128,
          apis=("legacy", "nki")) -> list[dict]:
    """Rows of every group count and variant; the coalesced variants once per API of ``apis``."""
    rng = np.random.default_rng(0)
    slab = hkv * block * head
    f = block_row_len(slab, 2)
    n_sub = slab // f
    start = allocate_kv_caches(n_layers, N_BLOCKS, hkv, block, head, DTYPE)
    for layer in start:
        layer[...] = rng.standard_normal(layer.shape).astype(DTYPE)
    rows = []
    for g in GROUPS:
        mapping = group_mapping(n, g)
        pairs = block_copy_row_pairs(mapping[:, 0], mapping[:, 1], num_layers=n_layers,
                                     src_num_blocks=N_BLOCKS, dst_num_blocks=N_BLOCKS, n_sub=n_sub)
        results = {}
        runs = [(v, api) for v in VARIANTS for api in (apis if v.startswith("coalesced") else ("legacy",))]
        for variant, api in runs:
            layers = allocate_kv_caches(n_layers, N_BLOCKS, hkv, block, head, DTYPE)
            for dst_layer, src_layer in zip(layers, start):
                dst_layer[...] = src_layer
            with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
                if variant == "coalesced":
                    copy_blocks(layers, mapping, api=api, lnc=1)
                elif variant == "coalesced per layer":          # L launches of the same kernel
                    for layer in layers:
                        copy_blocks([layer], mapping, api=api, lnc=1)
                else:
                    ordered, sizes = batches(pairs, n_layers, n, g, n_sub,
                                             "block" if variant == "per-block" else "group")
                    whole = layers[0].base            # the (L, 2, N, Hkv, B, d) buffer
                    copy_rows_batched(whole, ordered, row_elems=f, batch_sizes=sizes)
            results[(variant, api)] = b"".join(layer.tobytes() for layer in layers)
            rows.append({"groups": g, "variant": variant, "layers": n_layers, "blocks": n,
                         "cache_shape": [2, N_BLOCKS, hkv, block, head], "row_bytes": f * 2,
                         **summarize(trace, api)})
        if len(set(results.values())) != 1:
            raise AssertionError(f"g={g}: variants produced different caches")
        kv = {r["kv_bytes"] for r in rows if r["groups"] == g}
        if len(kv) != 1:
            raise AssertionError(f"g={g}: payload bytes differ across variants: {kv}")
    return rows


def fmt(x, spec=""):
    return "-" if x is None else format(x, spec)


def markdown(rows: list[dict]) -> str:
    r0 = rows[0]
    title = (f"L={r0['layers']} layers, {r0['blocks']} blocks copied, cache {tuple(r0['cache_shape'])} bf16, "
             f"rows of {r0['row_bytes']} B")
    lines = [title, "",
             "| groups | variant | API | gather+scatter DMAs | index DMAs | all DMA instr | descriptors "
             "| KV bytes | modeled trn2 us | modeled trn1 us |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['groups']} | {r['variant']} | {r['api']} | {r['gather_scatter_dmas']} "
                     f"| {r['index_dmas']} "
                     f"| {r['dma_instructions']} | {r['dma_descriptors']} | {r['kv_bytes']} "
                     f"| {fmt(r['modeled_us_trn2'], '.2f')} | {fmt(r['modeled_us_trn1'], '.2f')} |")
    note = ("\nmodeled = nki_sim.cost.estimate on the simulator trace (analytical model, not a measurement; "
            "kernel launch overhead is not modeled, so per-layer launches look cheaper than they are).")
    if estimate is None:
        note = "\nnki_sim.cost is not available: DMA counts only."
    return "\n".join(lines) + note


QUICK = {"layers": 2, "blocks": 6, "kv_heads": 2, "block_size": 8, "head_size": 64}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=None, help="layers (default 4)")
    ap.add_argument("--blocks", type=int, default=None, help="blocks copied (divisible by 6; default 24)")
    ap.add_argument("--kv-heads", type=int, default=None, help="default 8")
    ap.add_argument("--block-size", type=int, default=None, help="default 16")
    ap.add_argument("--head-size", type=int, default=None, help="default 128")
    add_api_arg(ap, default="both", what="the coalesced kernel (the baselines are legacy)")
    add_common_args(ap, quick_help="small shapes: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    args = parse_args(ap, argv)
    defaults = QUICK if args.quick else {"layers": 4, "blocks": 24, "kv_heads": 8, "block_size": 16,
                                         "head_size": 128}
    shape = {k: defaults[k] if getattr(args, k) is None else getattr(args, k) for k in defaults}
    for k in ("layers", "kv_heads", "block_size", "head_size"):
        if shape[k] < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1; got {shape[k]}")
    if shape["blocks"] % 6 or shape["blocks"] <= 0 or 4 * shape["blocks"] > 2 * N_BLOCKS:
        ap.error(f"--blocks must be a positive multiple of 6 and <= {N_BLOCKS // 2}; got {shape['blocks']}")
    apis = tuple(a for _, a in api_runs(args.api, ["trn2"]))       # traces are simulated for trn2
    rows = bench(shape["layers"], shape["blocks"], shape["kv_heads"], shape["block_size"],
                 shape["head_size"], apis)
    print(markdown(rows))
    write_json(args, __file__, rows, cost_model=estimate is not None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
