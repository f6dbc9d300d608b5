#!/usr/bin/env python
"""MODELED benchmark: attention variants in the scheduled kernel (decode batches).

Every workload runs host.paged_attention(kernel="scheduled") on nki_sim under tracing, and
nki_sim.cost.estimate turns the trace into modeled per-engine times. Nothing is measured on
hardware: every time printed here is MODELED (docs/cost-model.md).

    python scripts/bench_variants.py --quick [--json quick.json] [--markdown FILE]
    python scripts/bench_variants.py --json full.json --markdown docs/bench-variants.md [--plot f.png]
    python scripts/bench_variants.py --targets trn2 --api both     # legacy vs current API on trn2

Workloads (S decode sequences, 1 new token each, equal contexts):
    plain 4K / plain 32K       no option, context 4096 / 32768
    window 4K @ 32K            sliding_window=4096 at context 32768 (sees what plain 4K sees)
    fp8 e4m3fn 4K / 32K        float8_e4m3fn cache with per-head k_scale / v_scale, bf16 queries
    fp8 e5m2 4K                the same with a float8_e5m2 cache
    soft-cap / sinks / ALiBi   one option each at context 4096 (overhead vs plain 4K)
    window+sinks+fp8 @ 32K     the three together
Full run: H=32, Hkv=8, d=128, block 32, LARGE_TILE_SZ=2048, S=32, bf16 queries and cache
(except fp8 rows), mixed precision, trn1 and trn2 (--targets), each on the NKI API(s) of --api
(nki_pa_cli.script_args: auto = trn1 legacy, trn2 the current nki API). --quick: S=4, H=8, Hkv=2 (same d, block,
contexts and tile); the cost model charges KV heads and sequences one after the other on one
NeuronCore, so times scale with S * Hkv and the ratios between rows do not.

All sequences of a batch share one pool of physical cache blocks (each block table is its own
permutation of the pool), which keeps the 32K batch at one sequence's worth of cache memory;
the kernel gathers every row by index, so the modeled cost does not depend on the aliasing.

Columns: modeled us; HBM bytes (DMA bytes with an HBM side); KV bytes (bytes of the indirect
gathers of cached K/V rows and overlay rows, identified by their descriptor size = one row of
b' tokens x d channels in the cache dtype); DMA instructions; per-engine us; efficiency =
useful time / modeled time, useful time = useful bytes / BW with useful bytes = the visible
cached K/V once per KV head in the cache dtype + q, k, v and out once, BW = min(HBM per core,
16 x practical DMA engine bandwidth) = 272 GB/s (trn1) / 362.5 GB/s (trn2) (nki_sim.cost).
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

from nki_pa_cli.script_args import (add_api_arg, add_common_args, add_markdown_arg,  # noqa: E402
                                    api_runs, check_api_targets, parse_args, write_json,
                                    write_markdown)

D, BLOCK, TILE = 128, 32, 2048
TARGETS = ("trn1", "trn2")
SCALE = 1.0 / 200.0            # fp8 scales: cached values fp8(x / scale), x in U[-1, 1]
REF_MAX_CONTEXT = 4096         # max |err| vs the float64 reference only up to this context


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    context: int
    baseline: str               # workload whose modeled time the ratio column divides by
    options: tuple = ()         # variant options: "window", "softcap", "sinks", "alibi", "fp8"
    window: int = 4096


def make_workloads() -> list[Workload]:
    return [
        Workload("plain 4K", 4096, "plain 4K"),
        Workload("plain 32K", 32768, "plain 4K"),
        Workload("window 4K @ 32K", 32768, "plain 4K", ("window",)),
        Workload("fp8 e4m3fn 4K", 4096, "plain 4K", ("fp8",)),
        Workload("fp8 e5m2 4K", 4096, "plain 4K", ("fp8", "e5m2")),
        Workload("fp8 e4m3fn 32K", 32768, "plain 32K", ("fp8",)),
        Workload("soft-cap 4K", 4096, "plain 4K", ("softcap",)),
        Workload("sinks 4K", 4096, "plain 4K", ("sinks",)),
        Workload("ALiBi 4K", 4096, "plain 4K", ("alibi",)),
        Workload("window+sinks+fp8 @ 32K", 32768, "plain 4K", ("window", "sinks", "fp8")),
    ]


def make_inputs(w: Workload, S: int, H: int, Hkv: int, seed: int = 0):
    """(args, options, cache_itemsize): positional host.paged_attention arguments and the
    variant keywords of workload ``w``."""
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(seed)
    nblk = -(-w.context // BLOCK)
    pool = nblk + 1
    bt = np.stack([rng.permutation(pool)[:nblk] for _ in range(S)]).astype(np.int32)

    def u(*shape):
        return rng.uniform(-1.0, 1.0, shape).astype(np.float32)

    cache = u(2, pool, Hkv, BLOCK, D)
    opts = {}
    if "fp8" in w.options:
        fp8 = ml_dtypes.float8_e5m2 if "e5m2" in w.options else ml_dtypes.float8_e4m3fn
        cache = (cache / SCALE).astype(fp8)
        opts.update(k_scale=SCALE, v_scale=SCALE)
    else:
        cache = cache.astype(bf16)
    if "window" in w.options:
        opts["sliding_window"] = w.window
    if "softcap" in w.options:
        opts["logits_soft_cap"] = 30.0
    if "sinks" in w.options:
        opts["sinks"] = rng.normal(0.0, 1.0, H).astype(np.float32)
    if "alibi" in w.options:
        opts["alibi_slopes"] = np.array([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)], np.float32)
    q = np.ones(S, np.int64)
    c = np.full(S, w.context, np.int64)
    args = (u(S, H, D).astype(bf16), u(S, Hkv, D).astype(bf16), u(S, Hkv, D).astype(bf16), cache,
            bt, q, c)
    return args, opts, cache.dtype.itemsize


def useful_bytes(w: Workload, S: int, H: int, Hkv: int, cache_itemsize: int) -> int:
    """Visible cached K/V once per KV head (cache dtype) + q, k, v and out once (bf16)."""
    visible = min(w.context, w.window - 1) if "window" in w.options else w.context
    kv = 2 * S * visible * Hkv * D * cache_itemsize
    return kv + S * (2 * H + 2 * Hkv) * D * 2


def useful_bandwidth(target: str) -> float:
    """min(HBM per core, 16 x practical DMA engine bandwidth), bytes per ns (= GB/s)."""
    from nki_sim.cost import get_constants
    hw = get_constants(target)
    return min(hw.hbm_bw_bytes_per_ns, hw.dma_peak_bytes_per_ns)


def kv_gather_bytes(trace, row_bytes) -> int:
    """Bytes of the HBM -> SBUF indirect DMAs whose every descriptor is one KV row (a cache
    row, or an overlay row, which for an fp8 cache is in the kernel dtype, of the full or the
    partial phase's geometry: ``row_bytes`` is the set of all those sizes)."""
    sizes = set(row_bytes)
    return sum(e.bytes for e in trace.events
               if e.engine == "dma" and e.dma_kind == "indirect" and e.src_buffer == "hbm"
               and e.descriptor_bytes and set(e.descriptor_bytes) <= sizes)


def run(w: Workload, target: str, S: int, H: int, Hkv: int, api: str = "auto") -> dict:
    import nki_sim
    from nki_sim.cost import estimate
    from host.attention import paged_attention
    from host.reference import paged_attention_ref
    from host.scheduled.schedule import item_geometry, make_schedule

    args, opts, itemsize = make_inputs(w, S, H, Hkv)
    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        t0 = time.perf_counter()
        out = paged_attention(*args, large_tile_size=TILE, mixed_precision=True, backend="sim",
                              kernel="scheduled", api=api, **opts)
        wall = time.perf_counter() - t0
    rep = estimate(trace, target=target)
    bps = {item_geometry(BLOCK, t)[1] for t in (512, 1024, 2048) if t <= TILE}
    sizes = {b * D * n for b in bps for n in (itemsize, 2)}
    ltp = make_schedule(args[5], args[6], args[4], num_heads=H, num_kv_heads=Hkv, head_size=D,
                        block_size=BLOCK, num_blocks=args[3].shape[1], large_tile_size=TILE,
                        sliding_window=opts.get("sliding_window"),
                        partial_tile_size="auto").partial_tile_size
    useful = useful_bytes(w, S, H, Hkv, itemsize)
    useful_us = useful / useful_bandwidth(target) / 1e3
    err = None
    if w.context <= REF_MAX_CONTEXT:
        err = float(np.abs(np.asarray(out, np.float64) - paged_attention_ref(*args, **opts)).max())
    return dict(workload=w.name, baseline=w.baseline, target=target, api=api, S=S, H=H, Hkv=Hkv, d=D,
                block_size=BLOCK, context=w.context, options=list(w.options),
                cache_dtype=np.dtype(args[3].dtype).name,
                modeled_us=round(rep.modeled_us, 2), hbm_bytes=rep.hbm_bytes,
                kv_bytes=kv_gather_bytes(trace, sizes), partial_tile_size=ltp,
                dma_instructions=rep.dma_instructions,
                per_engine_us={k: round(v, 2) for k, v in rep.per_engine_us.items()},
                bottleneck=rep.bottleneck, useful_bytes=useful,
                useful_bw_gbps=useful_bandwidth(target), useful_us=round(useful_us, 2),
                efficiency=round(useful_us / rep.modeled_us, 4) if rep.modeled_us else 0.0,
                max_abs_err=err, sim_wall_s=round(wall, 1))


def bench(quick: bool, runs=(("trn1", "legacy"), ("trn2", "nki"))) -> list[dict]:
    """Every workload on every (target, api) of ``runs``."""
    S, H, Hkv = (4, 8, 2) if quick else (32, 32, 8)
    rows = []
    for w in make_workloads():
        for target, api in runs:
            rows.append(run(w, target, S, H, Hkv, api))
            r = rows[-1]
            print(f"  {w.name} {target} {api}: {r['modeled_us']} us MODELED ({r['sim_wall_s']} s "
                  "sim)", file=sys.stderr)
    base = {(r["workload"], r["target"], r["api"]): r["modeled_us"] for r in rows}
    for r in rows:
        b = base[(r["baseline"], r["target"], r["api"])]
        r["vs_baseline"] = round(r["modeled_us"] / b, 4) if b else None
    return rows


def table(rows) -> str:
    head = ("| workload | target | API | cache | LTp | modeled us | vs base | HBM MB | KV MB | DMA instr "
            "| TensorE us | VectorE us | ScalarE us | GpSimd us | DMA us | efficiency | max abs err |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        e = r["per_engine_us"]
        err = "—" if r["max_abs_err"] is None else f"{r['max_abs_err']:.1e}"
        lines.append(
            f"| {r['workload']} | {r['target']} | {r['api']} | {r['cache_dtype']} | {r['partial_tile_size']} "
            f"| {r['modeled_us']:.1f} "
            f"| {r['vs_baseline']:.2f}x | {r['hbm_bytes'] / 1e6:.1f} | {r['kv_bytes'] / 1e6:.1f} "
            f"| {r['dma_instructions']} | {e['tensor']:.1f} | {e['vector']:.1f} | {e['scalar']:.1f} "
            f"| {e['gpsimd']:.1f} | {e['dma']:.1f} | {r['efficiency']:.2f} | {err} |")
    return "\n".join(lines)


def _runs(rows) -> list[tuple[str, str]]:
    """The (target, api) pairs of ``rows``, in row order."""
    return list(dict.fromkeys((r["target"], r["api"]) for r in rows))


def _ratio(rows, a, b, run, key="modeled_us"):
    get = {(r["workload"], r["target"], r["api"]): r[key] for r in rows}
    return get[(a, *run)] / get[(b, *run)]


def findings(rows) -> str:
    """Ratios computed from the rows (so the text never disagrees with the table)."""
    out = []
    for t in _runs(rows):
        out.append(
            f"* **{t[0]}, {t[1]} API**: window 4K @ 32K / plain 4K = {_ratio(rows, 'window 4K @ 32K', 'plain 4K', t):.2f}x "
            f"modeled time, {_ratio(rows, 'window 4K @ 32K', 'plain 4K', t, 'kv_bytes'):.2f}x KV bytes; "
            f"plain 32K / plain 4K = {_ratio(rows, 'plain 32K', 'plain 4K', t):.2f}x. "
            f"fp8 / bf16: e4m3fn 4K {_ratio(rows, 'fp8 e4m3fn 4K', 'plain 4K', t):.2f}x modeled time "
            f"({_ratio(rows, 'fp8 e4m3fn 4K', 'plain 4K', t, 'kv_bytes'):.2f}x KV bytes), "
            f"e5m2 4K {_ratio(rows, 'fp8 e5m2 4K', 'plain 4K', t):.2f}x, "
            f"e4m3fn 32K {_ratio(rows, 'fp8 e4m3fn 32K', 'plain 32K', t):.2f}x "
            f"({_ratio(rows, 'fp8 e4m3fn 32K', 'plain 32K', t, 'kv_bytes'):.2f}x KV bytes). "
            f"Overhead vs plain 4K: soft-cap {_ratio(rows, 'soft-cap 4K', 'plain 4K', t):.2f}x, "
            f"sinks {_ratio(rows, 'sinks 4K', 'plain 4K', t):.2f}x, "
            f"ALiBi {_ratio(rows, 'ALiBi 4K', 'plain 4K', t):.2f}x.")
    return "\n".join(out)


def header(rows, quick: bool) -> str:
    r = rows[0]
    bw = ", ".join(f"{t} {useful_bandwidth(t):g} GB/s" for t in dict.fromkeys(r["target"] for r in rows))
    return (f"MODELED (nki_sim.cost, not measured): scheduled kernel, {r['S']} decode sequences, "
            f"H={r['H']}, Hkv={r['Hkv']}, d={r['d']}, block {r['block_size']}, "
            f"LARGE_TILE_SZ={TILE}, bf16 queries, mixed precision{' (--quick)' if quick else ''}. "
            f"Efficiency = useful bytes / BW / modeled time, BW: {bw}.")


def markdown(rows, quick: bool, command: str = "", commit: str = "") -> str:
    cmd = command or ("python scripts/bench_variants.py" + (" --quick" if quick else "") +
                      " --json out.json --markdown docs/bench-variants.md")
    at = f" at commit {commit}" if commit else ""
    return f"""# Attention variants: modeled cost (MODELED)

Generated by `{cmd}`{at}. Every time here is **modeled** by
`nki_sim.cost` from exact simulator counts ([cost-model.md](cost-model.md)); nothing was measured
on hardware.

{header(rows, quick)}

{table(rows)}

## Findings (ratios of the rows above)

{findings(rows)}

## How to read it

* *vs base* divides by the plain bf16 row of the same context (4K, or 32K for the 32K fp8 row).
* *LTp* is the partial tile size the schedule picked (`partial_tile_size="auto"`,
  docs/layouts.md §16.3): masked items at a sequence's end or a window's edge use tiles of LTp
  keys. A decode whose last tile holds one key gets 512; a window's lower edge, seen whole by all
  but a few keys, keeps whole 2048-key partial tiles.
* *KV MB* counts the indirect gathers of cached K/V rows and of the overlay rows (a sequence's
  partly filled last context row and its new token), identified by their descriptor size (one
  row of b' tokens x d channels in the cache dtype, in either phase's geometry; overlay rows of
  an fp8 cache are bf16). A window prunes whole KV tiles that no query of the sequence sees; key
  rows wholly before the window are not gathered either.
* *Efficiency* divides the time the useful bytes need at the DMA-or-HBM bound (the visible
  cached K/V once per KV head in the cache dtype, plus q, k, v and out once) by the modeled
  time. It ignores compute, so a compute-bound row cannot reach 1.
* fp8 halves the cached bytes moved and adds no pass over the keys: the fp8 rows are TensorE
  operands as they are (K^T by identity matmuls, V in the PV matmul); only a partial item's
  bf16 overlay rows take extra TensorE work (their own transposes and PV products). Where DMA is
  the busiest engine (trn1, long contexts) the saving shows almost in full; where the compute
  engines are nearly as busy (trn2 at 4K) less of it does. On trn2's current API a bf16 cache's
  K^T comes by indirect DMA transpose (2-byte dtypes only), while an fp8 cache's K^T still takes
  the identity matmuls and their PSUM copies, so there fp8 can cost more than bf16 at short
  contexts.
  fp8 rows of b' = 16 tokens are 2 KiB descriptors (bf16: 4 KiB), a little less efficient per
  byte.
* The batch shares one pool of physical cache blocks among its sequences (the kernel gathers by
  index; modeled costs do not depend on the aliasing). `--quick` uses fewer sequences and heads;
  modeled times scale with sequences x KV heads, the ratios do not.
"""


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(dict.fromkeys(r["workload"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    x = np.arange(len(names))
    runs = _runs(rows)
    width = 0.8 / len(runs)
    for k, (t, api) in enumerate(runs):
        v = [next(r["modeled_us"] for r in rows if r["workload"] == n and r["target"] == t
                  and r["api"] == api) for n in names]
        ax.bar(x + (k - (len(runs) - 1) / 2) * width, v, width, label=f"{t} {api}")
    ax.set_xticks(x, names, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("modeled us (MODELED)")
    ax.set_title("Attention variants, scheduled kernel (MODELED)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, quick_help="4 sequences, H=8, Hkv=2 (about a minute)",
                    plot_help="bar chart of the modeled times")
    add_markdown_arg(ap, "write the table, findings and method as a markdown page")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    add_api_arg(ap, default="auto", what="the scheduled kernel")
    a = parse_args(ap, argv)
    check_api_targets(ap, a.api, a.targets)
    t0 = time.perf_counter()
    rows = bench(a.quick, api_runs(a.api, a.targets))
    print(header(rows, a.quick))
    print(table(rows))
    print(findings(rows))
    print(f"(simulation wall time {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    write_json(a, __file__, rows, times="MODELED")
    write_markdown(a, __file__, argv, lambda cmd, commit: markdown(rows, a.quick, cmd, commit))
    if a.plot:
        plot(rows, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
