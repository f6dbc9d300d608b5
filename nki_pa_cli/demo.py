"""The demo: one mixed GQA batch through ``host.paged_attention`` on the embedded simulator.

Steps: build a seeded batch (one prefill chunk plus decodes, scattered cache blocks); compute
the float64 reference (``host.paged_attention_ref``); for every kernel and every target (trn1,
trn2) run ``host.paged_attention(..., backend="sim")`` under ``nki_sim.tracing()``, compare with
the reference and model the trace with ``nki_sim.cost.estimate``. All times are MODELED (an
analytical model of exact simulator counts, docs/cost-model.md), never measured.

Dimensions: S sequences, T = sum(query_lens) new tokens, H / Hkv query / KV heads, d head size,
N cache blocks, B block size. Arrays: query (T, H, d), key / value (T, Hkv, d), kv_cache
(2, N, Hkv, B, d), block_tables (S, max_blocks) int32, all float32 except the table.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from nki_sim.cost import ENGINES

TARGETS = ("trn1", "trn2")
# Largest accepted max |error| for fp32 inputs in mixed precision (bf16 matmuls, fp32 statistics).
# The same bound as the ("mixed", "float32") entry of the test tolerance table (tests/conftest.py);
# a test keeps the two equal.
TOLERANCE = 3e-2


@dataclasses.dataclass(frozen=True)
class DemoBatch:
    """One flat batch: sequence i has query_lens[i] new tokens after context_lens[i] cached ones."""

    name: str
    query_lens: tuple
    context_lens: tuple
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    large_tile_size: int

    def describe(self) -> list[str]:
        prefill = [q for q in self.query_lens if q > 1]
        decodes = sum(q == 1 for q in self.query_lens)
        chunks = " + ".join(f"1 prefill chunk of {q} tokens" for q in prefill)
        g = self.num_heads // self.num_kv_heads
        return [f"{len(self.query_lens)} sequences: {chunks} + {decodes} decodes; "
                f"{sum(self.query_lens)} new tokens, contexts {min(self.context_lens)}.."
                f"{max(self.context_lens)} tokens ({sum(self.context_lens):,} cached in total)",
                f"H={self.num_heads} query heads, Hkv={self.num_kv_heads} KV heads (GQA {g}:1), "
                f"d={self.head_size}, block size {self.block_size}, LARGE_TILE_SZ "
                f"{self.large_tile_size}, fp32 inputs, mixed precision (bf16 matmuls)"]


FULL = DemoBatch("full", (128,) + (1,) * 7, (512, 2048, 1800, 3000, 900, 2500, 1200, 4096),
                 num_heads=32, num_kv_heads=8, head_size=128, block_size=32, large_tile_size=2048)
QUICK = DemoBatch("quick", (16, 1, 1, 1), (40, 300, 17, 129),
                  num_heads=8, num_kv_heads=2, head_size=64, block_size=16, large_tile_size=512)


def make_inputs(batch: DemoBatch, seed: int = 0) -> tuple:
    """(query, key, value, kv_cache, block_tables, query_lens, context_lens); U[-1, 1) float32.

    Each sequence gets ceil(context / B) distinct cache blocks drawn from a random permutation of
    N = (blocks needed) + 4 ids; unused table entries are -1.
    """
    rng = np.random.default_rng(seed)
    B = batch.block_size
    nblk = [-(-c // B) for c in batch.context_lens]
    num_blocks = sum(nblk) + 4
    ids = rng.permutation(num_blocks)
    tables = np.full((len(nblk), max(nblk) + 1), -1, np.int32)
    off = 0
    for i, n in enumerate(nblk):
        tables[i, :n] = ids[off:off + n]
        off += n
    T, H, Hkv, d = sum(batch.query_lens), batch.num_heads, batch.num_kv_heads, batch.head_size

    def uniform(*shape):
        return rng.uniform(-1, 1, shape).astype(np.float32)

    return (uniform(T, H, d), uniform(T, Hkv, d), uniform(T, Hkv, d),
            uniform(2, num_blocks, Hkv, B, d), tables,
            np.asarray(batch.query_lens, np.int64), np.asarray(batch.context_lens, np.int64))


def kernel_choices() -> tuple:
    """Every kernel ``host.paged_attention(kernel=...)`` accepts (``host.attention.KERNELS``),
    its default first."""
    from host import attention

    default = inspect.signature(attention.paged_attention).parameters["kernel"].default
    return tuple(sorted(attention.KERNELS, key=lambda k: k != default))


@dataclasses.dataclass
class RunResult:
    """One (kernel, target) run: numerics vs the reference and the MODELED cost of its trace."""

    kernel: str
    target: str
    max_abs_error: float
    passed: bool
    report: Any            # nki_sim.cost.CostReport
    trace: Any             # nki_sim.Trace

    @property
    def label(self) -> str:
        return f"{self.kernel} {self.target}"

    def as_dict(self) -> dict:
        r = self.report
        return {"kernel": self.kernel, "target": self.target, "max_abs_error": self.max_abs_error,
                "passed": self.passed, "modeled_us": r.modeled_us,
                "per_engine_us": dict(r.per_engine_us), "bottleneck": r.bottleneck,
                "dma_instructions": r.dma_instructions, "dma_bytes": r.dma_bytes,
                "instructions": len(self.trace.events)}


def run_demo(batch: DemoBatch, *, tolerance: float = TOLERANCE, seed: int = 0,
             kernels: tuple | None = None, targets: tuple = TARGETS,
             step: Callable[[str], None] = lambda note: None) -> list[RunResult]:
    """Run ``batch`` through every kernel on every target; ``step(note)`` after each stage."""
    import nki_sim
    from nki_sim.cost import estimate

    from host import paged_attention, paged_attention_ref

    inputs = make_inputs(batch, seed)
    ref = paged_attention_ref(*inputs)
    step("float64 reference")
    results = []
    for kernel in kernel_choices() if kernels is None else kernels:
        for target in targets:
            # one physical core (lnc=1): the report prices one NeuronCore's whole work
            with nki_sim.use_target(target), nki_sim.tracing() as trace:
                out = paged_attention(*inputs, large_tile_size=batch.large_tile_size,
                                      backend="sim", kernel=kernel, lnc=1)
            if not trace.events:
                raise RuntimeError("the kernel did not run on nki_sim (empty trace); "
                                   "run with NKI_PA_BACKEND=sim")
            err = float(np.abs(np.asarray(out, np.float64) - ref).max())
            results.append(RunResult(kernel, target, err, bool(err <= tolerance),
                                     estimate(trace, target), trace))
            step(results[-1].label)
    return results


def format_report(batch: DemoBatch, results: list[RunResult], tolerance: float) -> str:
    """The text the command prints: batch, accuracy per run, MODELED figures per run."""
    width = max(len(r.label) for r in results)
    lines = ["nki-pa demo: flash paged attention on nki_sim (the embedded NKI simulator)"]
    lines += ["  " + s for s in batch.describe()]
    lines.append(f"accuracy vs the float64 reference (host.paged_attention_ref), "
                 f"tolerance {tolerance:.1e}:")
    for r in results:
        lines.append(f"  {r.label:<{width}}  max |error| {r.max_abs_error:.2e}  "
                     f"{'PASS' if r.passed else 'FAIL'}")
    lines.append("MODELED on one NeuronCore (nki_sim.cost: analytical model of exact simulator "
                 "counts, not measured):")
    head = (f"  {'':<{width}}  {'modeled us':>10}  " + "  ".join(f"{e + ' us':>9}" for e in ENGINES)
            + f"  {'DMA instr':>9}  {'DMA MB':>8}")
    lines.append(head)
    for r in results:
        rep = r.report
        lines.append(f"  {r.label:<{width}}  {rep.modeled_us:>10.1f}  "
                     + "  ".join(f"{rep.per_engine_us[e]:>9.1f}" for e in ENGINES)
                     + f"  {rep.dma_instructions:>9}  {rep.dma_bytes / 1e6:>8.2f}")
    return "\n".join(lines)


def trace_name(r: RunResult) -> str:
    return f"trace-{r.kernel}-{r.target}.json"


def write_outputs(out_dir: Path, batch: DemoBatch, results: list[RunResult], tolerance: float,
                  png: bool) -> list[Path]:
    """Perfetto traces (one per run), summary.json and (if ``png``) modeled-engines.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for r in results:
        path = out_dir / trace_name(r)
        r.trace.to_chrome_json(str(path))
        written.append(path)
    summary = {"batch": dataclasses.asdict(batch), "tolerance": tolerance,
               "passed": all(r.passed for r in results), "times": "MODELED (nki_sim.cost)",
               "runs": [dict(r.as_dict(), trace=trace_name(r)) for r in results]}
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2))
    written.append(path)
    if png:
        from nki_pa_cli.plot import plot_engine_bars

        path = out_dir / "modeled-engines.png"
        plot_engine_bars(results, path, title=f"{batch.name} demo batch: " + batch.describe()[1])
        written.append(path)
    return written
