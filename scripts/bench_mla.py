#!/usr/bin/env python
"""MODELED benchmark of MLA decode (host.mla_paged_attention): 576- vs 640-element entries.

Every (workload, H, target, entry size) runs the MLA kernel on nki_sim under tracing and
nki_sim.cost.estimate turns the exact counts into MODELED times (docs/cost-model.md); nothing is
measured on hardware. Configuration: R = kv_lora_rank 512, P = qk_rope_head_dim 64, bf16 q and
cache, mixed precision, block size 64, large_tile_size 2048 (b' = 16 entries per gathered row),
one new token per sequence (already in the cache, MLA convention), one NeuronCore; on the NKI
API(s) of --api per target (nki_pa_cli.script_args: auto = trn1 legacy, trn2 the current nki).

Useful-work roofline per row: useful bytes = every context entry's R + P elements once + q + out;
BW = min(HBM per core, 16 x practical DMA engine bandwidth) = 272 GB/s (trn1) / 362.5 GB/s (trn2);
useful FLOPs = (2(R+P)H + 2RH) per visible (query token, key) pair at the TensorE bf16 peak;
roofline = max(bytes / BW, FLOPs / peak), efficiency = roofline / modeled.

"aligned, entry-wise (what-if)" re-costs the aligned trace with every KV-row gather descriptor
(b' whole 640-element entries) replaced by b' descriptors of the R + P = 576 elements a gather
reading only [0, R + P) of each entry would move -- same instructions, more and smaller
descriptors; the kernel itself gathers whole rows.

    python scripts/bench_mla.py --quick --json q.json
    python scripts/bench_mla.py --json full.json --markdown table.txt
    python scripts/bench_mla.py --targets trn2 --api both      # legacy vs current API on trn2
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

from nki_pa_cli.script_args import (add_api_arg, add_common_args, api_runs,  # noqa: E402
                                    check_api_targets, command_line, git_commit, parse_args,
                                    write_json)

R, P, B, LARGE_TILE = 512, 64, 64, 2048
ENTRY_SIZES = (576, 640)          # R + P unpadded; padded to 256 bytes (bf16)
HEADS = (16, 128)
TARGETS = ("trn1", "trn2")


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    context_lens: tuple            # per sequence, including its one new token


def make_workloads(quick: bool) -> list[Workload]:
    if quick:
        return [Workload("2 x 2K", (2048,) * 2)]
    rng = np.random.default_rng(0)
    mixed = tuple(int(c) for c in rng.integers(2048, 16385, 32))
    return [Workload("16 x 2K", (2048,) * 16), Workload("16 x 16K", (16384,) * 16),
            Workload("64 x 4K", (4096,) * 64), Workload("128 x 2K", (2048,) * 128),
            Workload("32 x 2K-16K", mixed)]


def make_batch(w: Workload, H: int, seed: int = 0) -> dict:
    """bf16 q (S, H, R+P) and a (N, B, 640) cache; the 576-entry cache is its first 576 columns
    (same values, so both layouts must give the same output). Cache values come from a small
    random table indexed at random (cheap for large contexts)."""
    import ml_dtypes
    rng = np.random.default_rng(seed)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    cl = np.asarray(w.context_lens, np.int64)
    nblk = -(-cl // B)
    N = int(nblk.sum()) + 1
    perm = rng.permutation(N)
    bt = np.full((len(cl), int(nblk.max())), -1, np.int32)
    off = 0
    for i, n in enumerate(nblk.tolist()):
        bt[i, :n] = perm[off:off + n]
        off += n
    table = rng.uniform(-1, 1, (509, R + P)).astype(np.float32).astype(bf16)
    cache = np.zeros((N, B, max(ENTRY_SIZES)), bf16)
    cache[:, :, :R + P] = table[rng.integers(0, 509, (N, B))]
    q = rng.uniform(-1, 1, (len(cl), H, R + P)).astype(np.float32).astype(bf16)
    return dict(q=q, cache=cache, block_tables=bt, query_lens=np.ones(len(cl), np.int64),
                context_lens=cl)


def useful_roofline(batch: dict, target: str) -> tuple[float, int, float]:
    """(roofline us, useful bytes, useful FLOPs) of a decode batch (module docstring)."""
    from nki_sim import cost
    hw = cost.get_constants(target)
    q, cl = batch["q"], batch["context_lens"]
    S, H, _ = q.shape
    item = q.dtype.itemsize
    nbytes = int(cl.sum()) * (R + P) * item + q.nbytes + S * H * R * item
    flops = float(cl.sum()) * (2 * (R + P) * H + 2 * R * H)
    bw = min(hw.hbm_bw_bytes_per_ns, hw.dma_engines * hw.dma_engine_bw_bytes_per_ns)   # B/ns
    us = max(nbytes / bw / 1e3, flops / (hw.tensor_peak_tflops * 1e12) * 1e6)
    return us, nbytes, flops


def entrywise_events(trace, entry_size: int, itemsize: int):
    """The trace's events with each whole-row KV gather descriptor (b' entries) split into b'
    descriptors of R + P elements (the 'entry-wise gather' what-if, module docstring)."""
    bp = LARGE_TILE // 128
    row_bytes = bp * entry_size * itemsize
    out = []
    for e in trace.events:
        if e.dma_kind == "indirect" and tuple(e.out_shape) == (128, bp * entry_size):
            assert set(e.descriptor_bytes) <= {row_bytes}
            descs = ((R + P) * itemsize,) * (bp * len(e.descriptor_bytes))
            e = dataclasses.replace(e, descriptor_bytes=descs, bytes=sum(descs))
        out.append(e)
    return out


def simulate(batch: dict, entry_size: int, target: str, api: str = "auto", lnc: int = 1):
    """Run the MLA kernel on nki_sim under tracing on ``api`` with ``lnc`` physical cores
    (this benchmark: 1, one NeuronCore; both cores of trn2: bench_lnc_parts.py) -> (output,
    trace, seconds)."""
    import nki_sim
    from host import mla_paged_attention
    cache = np.ascontiguousarray(batch["cache"][:, :, :entry_size])
    t0 = time.perf_counter()
    with nki_sim.use_target(target), nki_sim.tracing() as trace:
        out = mla_paged_attention(batch["q"], cache, batch["block_tables"], batch["query_lens"],
                                  batch["context_lens"], large_tile_size=LARGE_TILE, backend="sim",
                                  api=api, lnc=lnc)
    return out, trace, time.perf_counter() - t0


def row_for(w: Workload, H: int, E: int, target: str, batch: dict, trace, sim_s: float,
            api: str = "auto") -> dict:
    from nki_sim import cost
    rep = cost.estimate(trace, target)
    roof, nbytes, flops = useful_roofline(batch, target)
    s = trace.summary()
    row = dict(
        workload=w.name, num_seqs=len(w.context_lens), context_tokens=int(sum(w.context_lens)),
        max_context=int(max(w.context_lens)), H=H, entry_size=E, aligned=E != R + P,
        target=target, api=api, block_size=B, large_tile_size=LARGE_TILE, dtype="bfloat16",
        modeled_us=rep.modeled_us, lower_bound_us=rep.lower_bound_us, bottleneck=rep.bottleneck,
        per_engine_us=dict(rep.per_engine_us), useful_bytes=nbytes, useful_flops=flops,
        useful_roofline_us=roof, efficiency=roof / rep.modeled_us,
        dma_instructions=rep.dma_instructions,
        dma_indirect_instructions=s["dma_indirect_instructions"], descriptors=rep.dma_descriptors,
        dma_bytes=rep.dma_bytes, hbm_bytes=rep.hbm_bytes,
        peak_sbuf_bytes_per_partition=s["peak_sbuf_bytes_per_partition"], sim_seconds=sim_s)
    if row["aligned"]:
        alt = cost.estimate(entrywise_events(trace, E, batch["q"].dtype.itemsize), target)
        row.update(entrywise_modeled_us=alt.modeled_us, entrywise_descriptors=alt.dma_descriptors,
                   entrywise_dma_bytes=alt.dma_bytes)
    return row


def run(workloads, heads, runs, *, check_reference: bool, progress=True) -> list[dict]:
    """Every (workload, H) on every (target, api) of ``runs``, both entry sizes."""
    from nki_pa_cli.progress import Progress
    rows = []
    jobs = [(w, H) for w in workloads for H in heads]
    with Progress(len(jobs) * len(runs) * len(ENTRY_SIZES), label="bench_mla",
                  enabled=None if progress else False) as bar:
        for w, H in jobs:
            batch = make_batch(w, H)
            for t, api in runs:
                outs = []
                for E in ENTRY_SIZES:
                    out, trace, sim_s = simulate(batch, E, t, api)
                    rows.append(row_for(w, H, E, t, batch, trace, sim_s, api))
                    outs.append(out)
                    bar.advance(note=f"{w.name} H={H} {t} {api} E={E}")
                if not np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16)):
                    raise AssertionError(f"576- and 640-entry outputs differ ({w.name} H={H} {t} "
                                         f"{api})")
                if check_reference:
                    _check_reference(batch, outs[0])
    return rows


def _check_reference(batch, out) -> None:
    from host import mla_paged_attention_ref
    ref = mla_paged_attention_ref(batch["q"], batch["cache"], batch["block_tables"],
                                  batch["query_lens"], batch["context_lens"])
    err = float(np.abs(out.astype(np.float64) - ref).max())
    if err > 4e-2:                                  # tests/conftest.py ("mixed", "bfloat16")
        raise AssertionError(f"max |err| {err:.3e} vs the float64 reference")


def markdown_table(rows) -> str:
    """One line per (workload, H, target, api): unaligned (576) vs aligned (640) side by side."""
    pairs = {}
    for r in rows:
        pairs.setdefault((r["workload"], r["H"], r["target"], r["api"]), {})[r["entry_size"]] = r
    head = ("MODELED (nki_sim trace + nki_sim.cost; not measured). MLA decode, R=512, P=64, bf16, "
            f"mixed precision, B={B}, large_tile_size={LARGE_TILE}, one new token per sequence, "
            "one NeuronCore. Efficiency = useful-work roofline / modeled time.\n\n"
            "| workload | ctx tokens | H | target | API | modeled us 576 / 640 | 640 entry-wise what-if us "
            "| efficiency 576 / 640 | roofline us 576 | DMA instr | descriptors 576 / 640 "
            "| DMA MiB 576 / 640 | bottleneck 576 / 640 |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for (w, H, t, api), p in pairs.items():
        u, a = p[576], p[640]
        lines.append(
            f"| {w} | {u['context_tokens']} | {H} | {t} | {api} | {u['modeled_us']:.1f} / "
            f"{a['modeled_us']:.1f} | {a['entrywise_modeled_us']:.1f} | {u['efficiency']:.3f} / "
            f"{a['efficiency']:.3f} | {u['useful_roofline_us']:.1f} | {u['dma_instructions']} | "
            f"{u['descriptors']} / {a['descriptors']} | {u['dma_bytes'] / 2**20:.1f} / "
            f"{a['dma_bytes'] / 2**20:.1f} | {u['bottleneck']} / {a['bottleneck']} |")
    return "\n".join(lines)


def alignment_summary(rows) -> str:
    """One paragraph: does 256-byte entry alignment pay under the model?"""
    pairs = {}
    for r in rows:
        pairs.setdefault((r["workload"], r["H"], r["target"], r["api"]), {})[r["entry_size"]] = r
    ratios = [p[640]["modeled_us"] / p[576]["modeled_us"] for p in pairs.values()]
    what_if = [p[640]["entrywise_modeled_us"] / p[576]["modeled_us"] for p in pairs.values()]
    dma = [p[640]["per_engine_us"]["dma"] / p[576]["per_engine_us"]["dma"] for p in pairs.values()]
    faster = sum(x < 1.0 for x in ratios)
    return (f"MODELED: 640-element (256-byte) entries are faster than 576-element ones on {faster} of "
            f"{len(ratios)} rows; modeled time 640 / 576 = {min(ratios):.3f} - {max(ratios):.3f} "
            f"(DMA busy time {min(dma):.3f} - {max(dma):.3f}); an entry-wise gather of the aligned "
            f"cache: {min(what_if):.3f} - {max(what_if):.3f} of the 576 time.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, quick_help="2 sequences x 2K context (a few seconds), checked against the "
                    "float64 reference")
    ap.add_argument("--markdown", type=Path, metavar="FILE", help="write the table to FILE")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    ap.add_argument("--heads", nargs="+", type=int, choices=HEADS, default=list(HEADS))
    add_api_arg(ap, default="auto", what="the MLA kernel")
    ap.add_argument("--no-progress", action="store_true")
    args = parse_args(ap, argv)
    check_api_targets(ap, args.api, args.targets)
    t0 = time.perf_counter()
    rows = run(make_workloads(args.quick), args.heads, api_runs(args.api, args.targets),
               check_reference=args.quick, progress=not args.no_progress)
    table, summary = markdown_table(rows), alignment_summary(rows)
    command = command_line("bench_mla.py", sys.argv[1:] if argv is None else argv)
    write_json(args, __file__, rows, summary=summary, commit=git_commit(), command=command)
    print(table + "\n\n" + summary)
    if args.markdown is not None:
        args.markdown.write_text(table + "\n\n" + summary + f"\n\nGenerated at commit "
                                 f"{git_commit()} by `{command}`.\n")
        print(f"markdown: {args.markdown}")
    print(f"\n({len(rows)} simulations, {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
