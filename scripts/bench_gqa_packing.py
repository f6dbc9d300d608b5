#!/usr/bin/env python
"""MODELED benchmark: GQA query packing (host/dense/gqa_packing.py) vs the unpacked launch.

For each workload and target (trn1, trn2), host.paged_attention(kernel="dense") runs on nki_sim
under tracing with gqa_packing=False and True (packing is an option of the dense kernel; the
scheduled kernel always packs the heads of a KV head as rows); nki_sim.cost.estimate turns each trace into a modeled time.
Nothing is measured on hardware: every time printed here is MODELED (docs/cost-model.md).
Also reported: TensorE / VectorE / ScalarE instruction counts, DMA instructions and bytes, the
max |error| against the float64 reference (host.paged_attention_ref), what the "auto" rule
(host.dense.gqa_packing.choose_gqa_packing) picks, and its work model (128x128 score blocks per KV
head, unpacked / packed).

    python scripts/bench_gqa_packing.py [--quick] [--json out.json]
    python scripts/bench_gqa_packing.py --sweep [--quick] [--json sweep.json]

--sweep calibrates the rule: decode-like batches with q new tokens per sequence, for several
G, printing the work-model ratio next to the modeled-time ratio (packed / unpacked) and whether
the rule and the model agree on the faster side.

Configuration (stated in the header): d=128, block_size 32, fp32 inputs, mixed precision,
LARGE_TILE_SZ=2048. Full run: H=32 query heads with Hkv=8 (G=4) or Hkv=4 (G=8). --quick and
--sweep use Hkv=2 (H = G * 2) to keep the simulation short; the cost model charges KV heads one
after the other on one NeuronCore, so times scale with Hkv and the packed/unpacked ratios do not.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nki_pa_cli.script_args import add_common_args, parse_args, write_json  # noqa: E402

D, BLOCK, TILE = 128, 32, 2048
SMALL_HKV = 2            # --quick and --sweep
TARGETS = ("trn1", "trn2")


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    query_lens: tuple
    context_lens: tuple
    G: int = 4
    Hkv: int = SMALL_HKV


def make_workloads(quick: bool, seed: int = 0) -> list[Workload]:
    """decode-heavy (16 and 64 sequences x 1 token), mixed and prefill-heavy; seeded contexts."""
    rng = np.random.default_rng(seed)
    ctx = lambda n, lo, hi: tuple(int(x) for x in rng.integers(lo, hi + 1, n))  # noqa: E731
    if quick:
        return [Workload("decode-8", (1,) * 8, ctx(8, 1024, 2048)),
                Workload("mixed-1p+6d", (128,) + (1,) * 6, ctx(7, 256, 1024)),
                Workload("prefill-2x128", (128, 128), ctx(2, 0, 512))]
    return [Workload("decode-16", (1,) * 16, ctx(16, 2048, 4096), 4, 8),
            Workload("decode-64", (1,) * 64, ctx(64, 2048, 4096), 4, 8),
            Workload("decode-16 G=8", (1,) * 16, ctx(16, 2048, 4096), 8, 4),
            Workload("spec-16x4", (4,) * 16, ctx(16, 2048, 4096), 4, 8),
            Workload("mixed-4p+12d", (128,) * 4 + (1,) * 12, ctx(16, 2048, 4096), 4, 8),
            Workload("prefill-2x512", (512, 512), ctx(2, 0, 2048), 4, 8)]


def make_batch(w: Workload, seed: int = 0):
    """(query, key, value, kv_cache, block_tables, query_lens, context_lens), U[-1, 1] fp32."""
    rng = np.random.default_rng(seed)
    qlens = np.asarray(w.query_lens, np.int64)
    clens = np.asarray(w.context_lens, np.int64)
    T, H, HKV = int(qlens.sum()), w.G * w.Hkv, w.Hkv
    nblk = -(-clens // BLOCK)
    N = int(nblk.sum()) + 2
    perm = rng.permutation(N)
    bt = np.full((len(qlens), int(nblk.max()) + 1), -1, np.int32)
    off = 0
    for i, n in enumerate(nblk.tolist()):
        bt[i, :n] = perm[off:off + n]
        off += n
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    return (u(T, H, D), u(T, HKV, D), u(T, HKV, D), u(2, N, HKV, BLOCK, D), bt, qlens, clens)


def run(w: Workload, target: str, packed: bool, args, ref) -> dict:
    import nki_sim
    from nki_sim.cost import estimate
    from host.attention import paged_attention

    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        t0 = time.perf_counter()
        out = paged_attention(*args, large_tile_size=TILE, mixed_precision=True, backend="sim",
                              kernel="dense", gqa_packing=packed, lnc=1)      # one core
        wall = time.perf_counter() - t0
    s = trace.summary()
    rep = estimate(trace, target=target)
    e = s["engine_instructions"]
    return dict(workload=w.name, H=w.G * w.Hkv, Hkv=w.Hkv, G=w.G, target=target, packed=packed,
                tensor=e["tensor"], vector=e["vector"], scalar=e["scalar"],
                dma_instructions=s["dma_instructions"], dma_bytes=s["dma_bytes"],
                modeled_us=round(rep.modeled_us, 2), max_abs_err=float(np.abs(out - ref).max()),
                sim_wall_s=round(wall, 2))


def bench(workloads) -> list[dict]:
    from host.dense.gqa_packing import choose_gqa_packing, gqa_packing_work
    from host.reference import paged_attention_ref

    rows = []
    for w in workloads:
        args = make_batch(w)
        ref = paged_attention_ref(*args)
        kw = dict(context_lens=w.context_lens, large_tile_size=TILE)
        auto = choose_gqa_packing(w.query_lens, w.G * w.Hkv, w.Hkv, **kw)
        work = gqa_packing_work(w.query_lens, w.G * w.Hkv, w.Hkv, **kw)
        for target in TARGETS:
            for packed in (False, True):
                r = run(w, target, packed, args, ref)
                r.update(auto_packs=auto, work_blocks=work[int(packed)])
                rows.append(r)
                print(f"  {w.name} {target} packed={packed}: {r['modeled_us']} us modeled "
                      f"({r['sim_wall_s']} s sim)", file=sys.stderr)
    return rows


def table(rows) -> str:
    head = ("| workload | H/Hkv | target | packed | auto packs | TensorE | VectorE | ScalarE | DMA instr "
            "| DMA MB | work blocks | modeled us (MODELED) | speedup | max abs err |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    base = {}
    for r in rows:
        key = (r["workload"], r["target"])
        if not r["packed"]:
            base[key] = r["modeled_us"]
        sp = base[key] / r["modeled_us"] if r["modeled_us"] else float("nan")
        lines.append(f"| {r['workload']} | {r['H']}/{r['Hkv']} | {r['target']} | {'yes' if r['packed'] else 'no'} "
                     f"| {'yes' if r['auto_packs'] else 'no'} | {r['tensor']} | {r['vector']} "
                     f"| {r['scalar']} | {r['dma_instructions']} | {r['dma_bytes'] / 1e6:.2f} "
                     f"| {r['work_blocks']} | {r['modeled_us']:.1f} | {sp:.2f}x | {r['max_abs_err']:.2e} |")
    return "\n".join(lines)


def sweep(quick: bool, target: str = "trn2") -> list[dict]:
    """Decode-like batches (S sequences x q tokens, contexts 256 or 2048) for the rule's calibration."""
    from host.dense.gqa_packing import choose_gqa_packing, gqa_packing_work
    from host.reference import paged_attention_ref

    S = 4
    qs = (1, 8, 32) if quick else (1, 4, 8, 16, 24, 32, 40, 48, 56, 64, 128)
    Gs = (4,) if quick else (2, 4, 8)
    ctxs = (2048,) if quick else (256, 2048)
    rows = []
    for G, q, c in ((G, q, c) for G in Gs for q in qs for c in ctxs):
        w = Workload(f"{S}x{q}", (q,) * S, (c,) * S, G=G)
        args = make_batch(w)
        ref = paged_attention_ref(*args)
        kw = dict(context_lens=w.context_lens, large_tile_size=TILE)
        work = gqa_packing_work(w.query_lens, G * SMALL_HKV, SMALL_HKV, **kw)
        t = {p: run(w, target, p, args, ref)["modeled_us"] for p in (False, True)}
        rows.append(dict(target=target, S=S, q=q, G=G, context=c, work_unpacked=work[0], work_packed=work[1],
                         work_ratio=round(work[1] / work[0], 3),
                         modeled_us_unpacked=t[False], modeled_us_packed=t[True],
                         modeled_ratio=round(t[True] / t[False], 3),
                         auto_packs=choose_gqa_packing(w.query_lens, G * SMALL_HKV, SMALL_HKV, **kw)))
        print(f"  sweep {rows[-1]}", file=sys.stderr)
    return rows


def sweep_table(rows) -> str:
    lines = ["| target | S x q | context | G | work packed/unpacked | modeled packed/unpacked (MODELED) "
             "| auto packs | rule agrees |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        agree = r["auto_packs"] == (r["modeled_ratio"] < 1.0)
        lines.append(f"| {r['target']} | {r['S']}x{r['q']} | {r['context']} | {r['G']} | {r['work_ratio']:.3f} | {r['modeled_ratio']:.3f} "
                     f"| {'yes' if r['auto_packs'] else 'no'} | {'yes' if agree else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, quick_help=f"small workloads, Hkv={SMALL_HKV} (seconds)")
    ap.add_argument("--sweep", action="store_true", help="rule calibration sweep instead")
    a = parse_args(ap, argv)
    t0 = time.perf_counter()
    if a.sweep:
        rows = [r for t in TARGETS for r in sweep(a.quick, t)]
        print(f"Rule calibration, MODELED: S=4 sequences x q new tokens, equal contexts, "
              f"Hkv={SMALL_HKV}, H=G*Hkv, d={D}, B={BLOCK}, LT={TILE}")
        print(sweep_table(rows))
    else:
        rows = bench(make_workloads(a.quick))
        print(f"GQA packing, MODELED (nki_sim.cost): d={D}, B={BLOCK}, "
              f"LT={TILE}, fp32 inputs, mixed precision. Speedup = unpacked / packed modeled time.")
        print(table(rows))
    print(f"(simulation wall time {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    write_json(a, __file__, rows, mode="sweep" if a.sweep else "bench", times="MODELED")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
