#!/usr/bin/env python
"""MODELED benchmark: vectorized KV loads (product kernel) vs one DMA per KV block (baseline).

For each workload, block size, target (trn1, trn2) and variant, the kernel runs on nki_sim under
tracing, and nki_sim.cost.estimate turns the trace into modeled times. Nothing is measured on
hardware: every time printed here is MODELED (docs/cost-model.md).

    python scripts/bench_paged_attention.py --quick --json quick.json
    python scripts/bench_paged_attention.py --json full.json --plot docs/bench_context.png

Variants:
    vectorized  nki_kernels.flash_paged_attention (one indirect DMA per 128 gathered rows)
    per_block   nki_kernels.baselines.per_block_paged_attention (one DMA per block, K and V;
                same SBUF layout, descriptors and bytes: only the DMA instruction count differs)

Fixed configuration (stated in the table header): H=4 query heads, Hkv=1 KV head, d=128, bf16,
mixed precision, LARGE_TILE_SZ=2048. The cost model charges KV heads one after the other on one
NeuronCore, so e.g. H=8/Hkv=2 would take about twice these times with the same ratios.
Each target is simulated separately (the kernel's gen2/gen3 branches differ: trn2 uses DMA
transposes for the probabilities), so no trace is reused across targets.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

H, HKV, D, LARGE_TILE = 4, 1, 128, 2048
TARGETS = ("trn1", "trn2")
VARIANTS = ("vectorized", "per_block")
SENSITIVITY_INFLIGHT = 16      # a second estimate with more DMA transfers in flight


@dataclasses.dataclass(frozen=True)
class Workload:
    """A flat batch: per-sequence new-token counts and cached context lengths."""
    name: str
    query_lens: tuple
    context_lens: tuple

    @property
    def context_tokens(self) -> int:
        return int(sum(self.context_lens))


def make_workloads(quick: bool, seed: int = 0) -> list[Workload]:
    """decode-heavy, mixed and prefill-heavy batches (seeded). Full sizes follow the issue:
    decode = 64 sequences x 1 query x 2K-8K context; mixed = 4 prefill + 12 decode."""
    rng = np.random.default_rng(seed)

    def ints(lo, hi, n):
        return tuple(int(x) for x in rng.integers(lo, hi + 1, n))

    if quick:
        dec = Workload("decode", (1,) * 8, ints(1024, 2048, 8))
        mix = Workload("mixed", (48,) + (1,) * 4, (256,) + ints(512, 1024, 4))
        pre = Workload("prefill", (128, 96), ints(0, 256, 2))
    else:
        dec = Workload("decode", (1,) * 64, ints(2048, 8192, 64))
        mix = Workload("mixed", ints(128, 512, 4) + (1,) * 12, ints(0, 1024, 4) + ints(1024, 4096, 12))
        pre = Workload("prefill", ints(512, 1024, 4), ints(0, 512, 4))
    return [dec, mix, pre]


def make_batch(w: Workload, block_size: int, seed: int = 0):
    """Random bf16 tensors in the user layout (docs/layouts.md §2) for workload w."""
    import ml_dtypes
    rng = np.random.default_rng(seed)
    q_lens = np.asarray(w.query_lens, np.int64)
    c_lens = np.asarray(w.context_lens, np.int64)
    n_blk = -(-c_lens // block_size)
    N = int(n_blk.sum()) + 1
    perm = rng.permutation(N).astype(np.int32)
    bt = np.full((len(q_lens), max(1, int(n_blk.max()))), -1, np.int32)
    starts = np.concatenate([[0], np.cumsum(n_blk)[:-1]])
    for i, (s, n) in enumerate(zip(starts.tolist(), n_blk.tolist())):
        bt[i, :n] = perm[s:s + n]
    T = int(q_lens.sum())
    bf16 = np.dtype(ml_dtypes.bfloat16)

    def u(*shape):
        return rng.uniform(-1, 1, size=shape).astype(np.float32).astype(bf16)

    return dict(query=u(T, H, D), key=u(T, HKV, D), value=u(T, HKV, D),
                kv_cache=u(2, N, HKV, block_size, D), block_tables=bt,
                query_lens=q_lens, context_lens=c_lens)


def kernel_inputs(batch: dict, large_tile_size: int = LARGE_TILE):
    """The kernel's positional inputs (query, key, value, kv_cache, block_tables, mask), built
    with the host API exactly as host.attention.paged_attention does, plus T (real tokens)."""
    from host.block_tables import active_block_table
    from host.masks import build_attention_mask
    from host.plan import make_plan

    q, k, v, cache = batch["query"], batch["key"], batch["value"], batch["kv_cache"]
    T, h, d = q.shape
    _, N, hkv, B, _ = cache.shape
    plan = make_plan(batch["query_lens"], batch["context_lens"], block_size=B,
                     large_tile_size=large_tile_size)
    active = active_block_table(plan, batch["block_tables"], num_blocks=N)
    mask = build_attention_mask(plan)
    Qpad = plan.padded_queries
    q_in = np.zeros((1, h, d, Qpad), q.dtype)
    q_in[0, :, :, :T] = q.transpose(1, 2, 0)
    k_in = np.zeros((1, hkv, d, Qpad), q.dtype)
    k_in[0, :, :, :T] = k.transpose(1, 2, 0)
    v_in = np.zeros((1, hkv, Qpad, d), q.dtype)
    v_in[0, :, :T, :] = v.transpose(1, 0, 2)
    return (q_in, k_in, v_in, cache, active, mask), T


def kernels():
    """{variant: jit kernel}; imported lazily (installs nki_sim)."""
    from nki_kernels.baselines.per_block_paged_attention import per_block_paged_attention
    from nki_kernels.flash_paged_attention import flash_paged_attention
    return {"vectorized": flash_paged_attention, "per_block": per_block_paged_attention}


def simulate(variant: str, target: str, args: tuple, hkv: int, large_tile_size: int = LARGE_TILE):
    """Run one variant on nki_sim for one target under tracing -> (output, trace, seconds)."""
    import nki_sim
    from nki_kernels._nki import nki
    kern = kernels()[variant]
    t0 = time.perf_counter()
    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        out = nki.simulate_kernel(kern[1, hkv], *args, LARGE_TILE_SZ=large_tile_size)
    return np.asarray(out), trace, time.perf_counter() - t0


def row_for(w: Workload, block_size: int, target: str, variant: str, trace, sim_s: float) -> dict:
    """One JSON row: trace counts + modeled figures (+ a sensitivity estimate)."""
    from nki_sim import cost
    rep = cost.estimate(trace, target)
    alt = cost.estimate(trace, dataclasses.replace(cost.get_constants(target),
                                                   dma_inflight=SENSITIVITY_INFLIGHT))
    s = trace.summary()
    return dict(
        workload=w.name, target=target, variant=variant, block_size=block_size,
        large_tile_size=LARGE_TILE, heads=f"H={H},Hkv={HKV},d={D},bf16,mixed",
        num_seqs=len(w.query_lens), query_tokens=int(sum(w.query_lens)),
        context=w.context_tokens, max_context=int(max(w.context_lens)),
        dma_instructions=rep.dma_instructions, dma_indirect_instructions=s["dma_indirect_instructions"],
        descriptors=rep.dma_descriptors, trace_descriptors=s["dma_descriptors"],
        dma_bytes=rep.dma_bytes, hbm_bytes=rep.hbm_bytes, flops=rep.flops,
        modeled_us=rep.modeled_us, lower_bound_us=rep.lower_bound_us,
        upper_bound_us=rep.upper_bound_us, roofline_us=rep.roofline_us,
        fraction_of_roofline=rep.fraction_of_roofline, bottleneck=rep.bottleneck,
        per_engine_us=dict(rep.per_engine_us),
        dma_by_op=dict(Counter(e.op for e in trace.events if e.engine == "dma")),
        modeled_us_inflight16=alt.modeled_us, instructions=s["instructions"], sim_seconds=sim_s)


def run_grid(workloads, block_sizes, targets, progress=True) -> list[dict]:
    """Simulate every (workload, block size, target, variant); checks the two variants agree."""
    from _progress import Progress
    rows = []
    jobs = [(w, b, t) for w in workloads for b in block_sizes for t in targets]
    with Progress(len(jobs) * len(VARIANTS), label="bench", enabled=None if progress else False) as bar:
        for w, b, t in jobs:
            args, _ = kernel_inputs(make_batch(w, b))
            outs = {}
            for v in VARIANTS:
                outs[v], trace, sim_s = simulate(v, t, args, HKV)
                rows.append(row_for(w, b, t, v, trace, sim_s))
                bar.advance(note=f"{w.name} B={b} {t} {v}")
            if not np.array_equal(outs["vectorized"], outs["per_block"]):   # same arithmetic
                raise AssertionError(f"per_block output differs from vectorized on {w.name} B={b} {t}")
    return rows


def pair_rows(rows):
    """{(workload, block, target): {variant: row}}."""
    out = {}
    for r in rows:
        out.setdefault((r["workload"], r["block_size"], r["target"]), {})[r["variant"]] = r
    return out


def markdown_table(rows) -> str:
    """One line per (workload, block size, target), both variants side by side.

    "KV gathers" are the indirect DMA instructions (the KV-cache loads); "DMA instr" counts every
    DMA of the kernel, including the Q / mask loads, the output stores and (gen3) the DMA
    transposes of the probabilities, which are the same for both variants."""
    head = (f"MODELED times (nki_sim trace + nki_sim.cost, not measured). H={H}, Hkv={HKV}, d={D}, "
            f"bf16, mixed precision, LARGE_TILE_SZ={LARGE_TILE}, one NeuronCore.\n\n"
            "| workload | ctx tokens | B | target | KV gathers vec / per-block | "
            "DMA instr vec / per-block | descriptors vec / per-block | DMA MiB | modeled us vec | modeled us per-block | speedup | "
            f"speedup if {SENSITIVITY_INFLIGHT} DMAs in flight | "
            "roofline frac vec / per-block | bottleneck vec / per-block |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for (w, b, t), p in pair_rows(rows).items():
        v, pb = p["vectorized"], p["per_block"]
        lines.append(
            f"| {w} | {v['context']} | {b} | {t} | "
            f"{v['dma_indirect_instructions']} / {pb['dma_indirect_instructions']} | "
            f"{v['dma_instructions']} / {pb['dma_instructions']}"
            f" | {v['descriptors']} / {pb['descriptors']} | {v['dma_bytes'] / 2**20:.1f} | "
            f"{v['modeled_us']:.1f} | {pb['modeled_us']:.1f} | "
            f"{pb['modeled_us'] / v['modeled_us']:.2f}x | "
            f"{pb['modeled_us_inflight16'] / v['modeled_us_inflight16']:.2f}x | "
            f"{v['fraction_of_roofline']:.3f} / "
            f"{pb['fraction_of_roofline']:.3f} | {v['bottleneck']} / {pb['bottleneck']} |")
    return "\n".join(lines)


def acceptance(rows) -> str:
    """One line: is the vectorized kernel modeled ahead, with fewer DMA instructions, everywhere?"""
    pairs = [p for p in pair_rows(rows).values() if len(p) == 2]
    ahead = [p["per_block"]["modeled_us"] > p["vectorized"]["modeled_us"] and
             p["per_block"]["dma_instructions"] > p["vectorized"]["dma_instructions"] for p in pairs]
    speedups = [p["per_block"]["modeled_us"] / p["vectorized"]["modeled_us"] for p in pairs]
    return (f"vectorized modeled ahead with fewer DMA instructions on {sum(ahead)}/{len(pairs)} "
            f"(workload, block size, target) rows; modeled speedup {min(speedups):.2f}x - "
            f"{max(speedups):.2f}x" if pairs else "no rows")


def context_sweep(contexts, targets, block_size=32, num_seqs=4, progress=True) -> list[dict]:
    """Decode batches of num_seqs sequences, each with the given context, for the plot."""
    workloads = [Workload(f"decode_ctx{c}", (1,) * num_seqs, (c,) * num_seqs) for c in contexts]
    return run_grid(workloads, [block_size], targets, progress=progress)


def plot(rows, path: str) -> None:
    """PNG of modeled time vs context length per target, both variants."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:   # pragma: no cover - depends on the environment
        raise SystemExit(f"--plot needs matplotlib (pip install matplotlib): {exc}") from exc
    targets = sorted({r["target"] for r in rows})
    fig, axes = plt.subplots(1, len(targets), figsize=(5.5 * len(targets), 4), squeeze=False)
    for ax, t in zip(axes[0], targets):
        for v, style in zip(VARIANTS, ("o-", "s--")):
            pts = sorted((r["max_context"], r["modeled_us"]) for r in rows
                         if r["target"] == t and r["variant"] == v)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=v)
        r0 = next(r for r in rows if r["target"] == t)
        ax.set_title(f"{t}: {r0['num_seqs']} decode seqs, B={r0['block_size']} (MODELED)")
        ax.set_xlabel("context tokens per sequence")
        ax.set_ylabel("modeled time (us)")
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"Flash paged attention, vectorized vs per-block KV loads — MODELED "
                 f"(H={H}, Hkv={HKV}, d={D}, bf16)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small set (under a minute on one core)")
    ap.add_argument("--json", metavar="PATH", help="write one row per (workload, block, target, variant)")
    ap.add_argument("--plot", metavar="PATH", help="PNG of modeled time vs context length")
    ap.add_argument("--block-sizes", type=int, nargs="+", help="override block sizes")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    ap.add_argument("--workloads", nargs="+", choices=("decode", "mixed", "prefill"))
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--table-from", metavar="JSON", help="only print the table of a --json file")
    a = ap.parse_args(argv)
    if a.table_from:
        rows = [r for r in json.loads(Path(a.table_from).read_text())
                if not r["workload"].startswith("decode_ctx")]
        print(markdown_table(rows))
        print("\n" + acceptance(rows))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    blocks = a.block_sizes or [16, 32, 128]
    wls = [w for w in make_workloads(a.quick) if not a.workloads or w.name in a.workloads]
    t0 = time.perf_counter()
    rows = run_grid(wls, blocks, a.targets, progress=not a.no_progress)
    print(markdown_table(rows))
    print("\n" + acceptance(rows))
    sweep = []
    if a.plot:
        contexts = (512, 1024, 2048) if a.quick else (512, 1024, 2048, 4096, 8192)
        sweep = context_sweep(contexts, a.targets, progress=not a.no_progress)
        plot(sweep, a.plot)
        print(f"\nplot: {a.plot}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows + sweep, f, indent=1)   # a list of rows; all times MODELED
        print(f"json: {a.json}")
    print(f"\n({len(rows) + len(sweep)} simulations, {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
