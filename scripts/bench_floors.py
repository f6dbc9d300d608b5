#!/usr/bin/env python
"""MODELED floors: the least time the scheduled kernel's design could take on the benchmark's
batches under the cost model, against the speed goals and the kernel as shipped.

A floor is a synthetic trace of only the instructions the design cannot do without, each at
the granularity the hardware imposes, priced by ``nki_sim.cost`` exactly as a kernel's trace
is (the same per-instruction formulas, static overheads and shared ports), plus the DMA and
descriptor work of the useful bytes. The model's time never falls when instructions are added
(busiest resource + 0.1 x the rest is monotone in every engine and port), so no kernel that
executes at least these instructions models faster: the floor is a lower bound for this
design, not a target.

Query-rows (prefill) classes, per Q block (128 rows: 32 tokens x G = 4 query heads) and per
512-key chunk any of its rows sees (a matmul output is one 2 KiB PSUM bank; chunks past the
block's last row are skipped, every other chunk is whole):
    TensorE  S = Q K^T (512 moving columns) and P V (four 128-key matmuls)
    VectorE  the exact row max: one reduce reading the chunk in PSUM (the masked steps' select
             and the scores' copy to SBUF ride along for free, a lower bound)
    P^T      trn1 (legacy API, no DMA transpose): four PE transposes and one PSUM copy on
             ScalarE, the faster of the two engines that read PSUM; trn2: the best split between
             SBUF -> SBUF DMA transposes and PE transposes + one copy per 1024 keys
per block and online-softmax step of <= 2048 keys: one exponential pass from SBUF over the
step's keys with its row sums (ScalarE), the state update o = alpha o + P V (VectorE, reading
PSUM) and alpha (ScalarE, one column).
Decode classes (keys on partitions, S^T = K Q^T), per sequence and KV head over its c + 1 keys:
    TensorE  per 128 keys S^T and (P V)^T (G = 4 moving columns, the 64-cycle minimum)
    K^T      trn1: one PE transpose per 128 keys and one ScalarE PSUM copy per 512 keys;
             trn2 current API: indirect DMA transposes (the DMA floor below)
    VectorE / ScalarE  one max pass and one exponential pass per 512 columns of S^T (128 keys
             x 4 rows per column group) and one state update per sequence
DMA: the useful bytes at what one core can pull, K^T by DMA transpose at its documented
efficiency (trn2 current API); GpSimd: the software descriptor generation of the indirect
gathers of every real 32-token cache row (hardware DGE cannot gather).
Left out (so the floor stays below any kernel of the design): masks, padding, per-item work,
state resets and stores, DMA descriptor overhead, dependency stalls, fill / drain latency.

    python scripts/bench_floors.py --quick
    python scripts/bench_floors.py --json out/bench/floors.json --markdown docs/bench-floors.md
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from nki_pa_cli.script_args import (add_common_args, add_markdown_arg,  # noqa: E402
                                    parse_args, write_json, write_markdown)

TARGETS = {"trn1": "legacy", "trn2": "nki"}
WORKLOADS = ("decode_32", "mixed_2x+30", "mixed_4x512+60", "prefill_2k_on_2k")
# The issue goals (efficiency, per physical core) by workload kind and target.
GOALS = {("decode", "trn1"): 0.80, ("decode", "trn2"): 0.85, ("mixed", "trn1"): 0.60,
         ("mixed", "trn2"): 0.60, ("prefill", "trn1"): 0.50, ("prefill", "trn2"): 0.50}
# The design's granularity, from the host-kernel contract and the host's tile choice: 128
# partitions, one PSUM bank (512 fp32) per score chunk, online-softmax steps of <= STEP_KEYS,
# decode cache rows of min(B, AUTO_DECODE_ROW_TOKENS) tokens (block 32 here); G = H / Hkv.
from host.scheduled.schedule_items import AUTO_DECODE_ROW_TOKENS  # noqa: E402
from nki_kernels.contract import PARTITIONS as P, PSUM_BANK_F32 as CHUNK  # noqa: E402
from nki_kernels.contract import STATE_EXTRA_COLUMNS, STEP_KEYS as STEP  # noqa: E402
import _pa_workloads as wl  # noqa: E402

BLOCK = 32                      # the benchmark's block size (scripts/bench_paged_attention.py)
ROW_TOKENS = min(BLOCK, AUTO_DECODE_ROW_TOKENS)
G = wl.H // wl.HKV
BLOCKS_PER_CHUNK = CHUNK // P             # 128-key blocks (PE transposes, P V matmuls) per chunk
DECODE_BLOCKS_PER_PASS = CHUNK // G        # 128-key blocks whose S^T columns fill one PSUM bank
SPLITS = 20                                 # trn2 P^T: DMA share searched in steps of 1/20


def _event(engine, op, in_shapes, out_shape, in_dtype, *, src="sbuf", dst="sbuf",
           free=None, **attrs):
    from nki_sim.trace import Event
    free = out_shape[-1] if free is None else free
    return Event(seq=0, engine=engine, op=op, name="floor", in_shapes=tuple(in_shapes),
                 out_shape=tuple(out_shape), in_dtypes=(in_dtype,) * len(in_shapes),
                 out_dtype=in_dtype, partitions=out_shape[0], free_elems=int(free), bytes=0,
                 src_loc=("floor", 0), loop_indices=(), program_id=(), src_buffer=src,
                 dst_buffer=dst, attrs=tuple(attrs.items()))


def _matmul(k, m, n, op="nc_matmul"):
    return _event("tensor", op, [(k, m), (k, n)], (m, n), "bfloat16", src="sbuf", dst="psum",
                  contraction=k, stationary_free=m, moving_free=n)


def prefill_blocks(q: int, c: int):
    """(keys, steps) per 128-row Q block of a q-token chunk on c cached tokens: the keys its
    last row sees and its online-softmax steps of <= STEP keys."""
    out = []
    for b in range(math.ceil(q * G / P)):
        keys = c + min(q, (b + 1) * P // G)
        out.append((keys, math.ceil(keys / STEP)))
    return out


class Floor:
    """Instruction counts of one launch's floor, priced per target by :func:`modeled`."""

    def __init__(self, target: str):
        self.target = target
        self.counts: dict = {}          # (kind, shape...) -> number of instructions
        self.dma_bytes = 0.0            # plain bytes
        self.dma_t_bytes = 0.0          # bytes by DMA transpose from HBM
        self.p_t_chunks = 0             # prefill chunks whose P^T is to be placed (trn2)
        self.gather_rows: list = []     # rows per indirect gather instruction

    def add(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n

    def prefill(self, q: int, c: int, hkv: int, d: int):
        for keys, steps in prefill_blocks(q, c):
            chunks = math.ceil(keys / CHUNK)
            self.add(("qk",), chunks * hkv)
            self.add(("pv",), BLOCKS_PER_CHUNK * chunks * hkv)
            self.add(("max", CHUNK), chunks * hkv)
            for s in range(steps):
                width = min(STEP, CHUNK * chunks - s * STEP)
                self.add(("exp_sbuf", width), hkv)
            self.add(("state", d + STATE_EXTRA_COLUMNS), steps * hkv)
            self.add(("alpha",), steps * hkv)
            if self.target == "trn1":
                self.add(("pe_t", P), BLOCKS_PER_CHUNK * chunks * hkv)
                self.add(("copy_psum", CHUNK), chunks * hkv)
            else:
                self.p_t_chunks += chunks * hkv
        self._kv(c + q, hkv, d, by_dma=False)

    def decode(self, c: int, hkv: int, d: int, k_by_dma: bool):
        keys = c + 1
        blocks = math.ceil(keys / P)
        self.add(("dec_mm",), 2 * blocks * hkv)
        for u in range(math.ceil(blocks / DECODE_BLOCKS_PER_PASS)):
            cols = G * min(DECODE_BLOCKS_PER_PASS, blocks - u * DECODE_BLOCKS_PER_PASS)
            self.add(("max", cols), hkv)
            self.add(("exp_psum", cols), hkv)
        self.add(("state_dec", d + STATE_EXTRA_COLUMNS), hkv)
        if not k_by_dma:
            self.add(("pe_t", P), blocks * hkv)
            self.add(("copy_psum", CHUNK), math.ceil(keys / CHUNK) * hkv)
        self._kv(keys, hkv, d, by_dma=k_by_dma)

    def _kv(self, keys: int, hkv: int, d: int, by_dma: bool):
        half = keys * d * 2 * hkv          # K (or V) bytes, bf16
        self.dma_bytes += half + (0 if by_dma else half)
        self.dma_t_bytes += half if by_dma else 0
        rows = math.ceil(keys / ROW_TOKENS)
        for _ in range(2 * hkv):            # K and V gathers of every KV head
            self.gather_rows += [P] * (rows // P) + ([rows % P] if rows % P else [])

    def events(self, d: int, p_dma_share: float = 0.0):
        """The floor's compute instructions as ``(event, count)`` pairs, and the bytes of its trn2
        P^T split: ``p_dma_share`` of the chunks by SBUF -> SBUF DMA transpose, the rest by PE
        transposes and one PSUM copy per 1024 keys (16-bit transposes: 8 blocks per bank)."""
        f32, bf = "float32", "bfloat16"
        make = {
            "qk": lambda: _matmul(d, P, CHUNK),
            "pv": lambda: _matmul(P, P, d),
            "dec_mm": lambda: _matmul(P, P, G),
            "pe_t": lambda n: _matmul(P, P, n, op="nc_transpose"),
            "max": lambda n: _event("vector", "tensor_reduce", [(P, n)], (P, 1), f32,
                                    src="psum", free=n),
            "exp_psum": lambda n: _event("scalar", "activation", [(P, n)], (P, n), f32,
                                         src="psum", func="exp"),
            "exp_sbuf": lambda n: _event("scalar", "activation", [(P, n)], (P, n), bf,
                                         reduce=True, func="exp"),
            "alpha": lambda: _event("scalar", "activation", [(P, 1)], (P, 1), f32, func="exp"),
            "copy_psum": lambda n: _event("scalar", "tensor_copy", [(P, n)], (P, n), bf,
                                          src="psum"),
            "state": lambda n: _event("vector", "scalar_tensor_tensor", [(P, n), (P, n)], (P, n),
                                      f32, src="psum"),
            "state_dec": lambda n: _event("vector", "scalar_tensor_tensor", [(G, n), (G, n)],
                                          (G, n), f32, src="psum"),
        }
        out = [(make[kind](*shape), n) for (kind, *shape), n in self.counts.items()]
        n_dma = round(self.p_t_chunks * p_dma_share)
        n_pe = self.p_t_chunks - n_dma
        out.append((_matmul(P, P, P, op="nc_transpose"), BLOCKS_PER_CHUNK * n_pe))
        out.append((_event("scalar", "tensor_copy", [(P, 2 * CHUNK)], (P, 2 * CHUNK), bf,
                           src="psum"), math.ceil(n_pe / 2)))
        return out, n_dma * P * CHUNK * 2


def modeled(fl: Floor, d: int, p_dma_share: float = 0.0) -> dict:
    """The floor's per-engine / port us and modeled us (busiest + 0.1 x the rest)."""
    from nki_sim.cost import estimate, get_constants
    hw = get_constants(fl.target)
    events, p_t_bytes = fl.events(d, p_dma_share)
    eng = dict.fromkeys(("tensor", "vector", "scalar", "gpsimd"), 0.0)
    ports: dict = {}
    for ev, n in events:            # each instruction priced alone, as in a kernel's trace
        rep = estimate([ev], fl.target)
        for e in eng:
            eng[e] += n * rep.per_engine_us[e]
        for k, v in rep.port_us.items():
            ports[k] = ports.get(k, 0.0) + n * v
    bw = wl.roofline_bandwidth(hw)
    dma_ns = max((fl.dma_bytes + fl.dma_t_bytes / hw.dma_transpose_efficiency_hbm
                  + p_t_bytes / hw.dma_transpose_efficiency_sbuf) / hw.dma_peak_bytes_per_ns,
                 (fl.dma_bytes + fl.dma_t_bytes) / bw)
    eng["dma"] = dma_ns / 1e3
    eng["gpsimd"] += sum(hw.gpsimd_start_cycles + hw.swdge_cycles_per_descriptor
                         * math.ceil(r / hw.swdge_cores) for r in fl.gather_rows
                         ) / hw.gpsimd_clock_ghz / 1e3
    lower = max(max(eng.values()), max(ports.values()))
    total = sum(eng.values())
    return dict(per_engine_us=eng, port_us=ports,
                modeled_us=lower + hw.overlap_inefficiency * (total - lower))


def floor_of(w, target: str) -> dict:
    """The floor of workload ``w`` on ``target`` (one launch: a mixed batch's two classes run
    as one pair launch, as the shipped kernel does)."""
    fl = Floor(target)
    k_by_dma = TARGETS[target] == "nki"
    for q, c in zip(w.query_lens, w.context_lens):
        if q == 1:              # a single-token decode: the keys-on-partitions step
            fl.decode(c, wl.HKV, wl.D, k_by_dma)
        else:
            fl.prefill(q, c, wl.HKV, wl.D)
    shares = [i / SPLITS for i in range(SPLITS + 1)] if fl.p_t_chunks else [0.0]
    best = min((modeled(fl, wl.D, s) | {"p_t_dma_share": s} for s in shares),
               key=lambda r: r["modeled_us"])
    return best


def run_one(w, target: str, shipped: bool) -> dict:
    import _pa_runs as runs
    roof = wl.useful_roofline_us(wl.useful_work(w), target)["us"]
    fl = floor_of(w, target)
    row = dict(workload=w.name, kind=w.kind, target=target, api=TARGETS[target],
               roofline_us=roof, floor_us=fl["modeled_us"], floor_efficiency=roof / fl["modeled_us"],
               floor_engines_us=fl["per_engine_us"], floor_ports_us=fl["port_us"],
               p_t_dma_share=fl["p_t_dma_share"], goal=GOALS.get((w.kind, target)))
    if shipped:
        _, trace, sec, meta = runs.simulate("scheduled", wl.make_batch(w, BLOCK), target,
                                            api=TARGETS[target], lnc=1)
        r = runs.make_row(w, BLOCK, target, "scheduled", trace, sec, meta, api=TARGETS[target])
        row |= dict(shipped_us=r["modeled_us"], shipped_efficiency=r["efficiency"],
                    shipped_engines_us=r["per_engine_us"], shipped_ports_us=r["port_us"])
    return row


def bench(quick: bool, targets, shipped: bool = True) -> list:
    ws = wl.make_workloads(quick)
    if not quick:
        ws = [w for w in ws if w.name in WORKLOADS]
    return [run_one(w, t, shipped) for w in ws for t in targets]


def _down(x: float) -> str:
    return f"{math.floor(x * 1000) / 1000:.3f}"       # 0.7997 is below 0.80


RESOURCES = ("tensor", "vector", "scalar", "gpsimd", "dma", "port vector+scalar",
             "port vector+gpsimd")


def _resources(engines: dict, ports: dict) -> dict:
    return dict(engines) | {f"port {k}": v for k, v in ports.items()}


def table(rows: list) -> str:
    out = ["| workload | target (API) | floor us (efficiency) | floor's busiest | shipped us "
           "(efficiency) | shipped / floor | goal |", "|---|---|---:|---|---:|---:|---:|"]
    for r in rows:
        res = _resources(r["floor_engines_us"], r["floor_ports_us"])
        top = max(res, key=res.get)
        shipped = (f"{r['shipped_us']:.0f} ({_down(r['shipped_efficiency'])})"
                   if "shipped_us" in r else "-")
        ratio = f"{r['shipped_us'] / r['floor_us']:.2f}x" if "shipped_us" in r else "-"
        goal = "-" if r["goal"] is None else f"{r['goal']:.2f}"
        out.append(f"| {r['workload']} | {r['target']} ({r['api']}) | {r['floor_us']:.0f} "
                   f"({_down(r['floor_efficiency'])}) | {top} {res[top]:.0f} | {shipped} | "
                   f"{ratio} | {goal} |")
    return "\n".join(out)


def engine_table(rows: list) -> str:
    """Per engine and shared port: the shipped kernel's busy us / the floor's (where the
    distance to the floor is)."""
    out = ["| workload | target | " + " | ".join(RESOURCES) + " |",
           "|---|---|" + "---:|" * len(RESOURCES)]
    for r in rows:
        if "shipped_us" not in r:
            continue
        got = _resources(r["shipped_engines_us"], r["shipped_ports_us"])
        floor = _resources(r["floor_engines_us"], r["floor_ports_us"])
        cells = [f"{got.get(k, 0.0):.0f} / {floor.get(k, 0.0):.0f}" for k in RESOURCES]
        out.append(f"| {r['workload']} | {r['target']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def markdown(rows: list, quick: bool, cmd: str, commit: str) -> str:
    return "\n".join([
        "# Floors of the scheduled kernel's design (MODELED)", "",
        f"Generated by `{cmd}` at commit {commit}{' (--quick)' if quick else ''}. Every time is "
        "**modeled** by `nki_sim.cost`; nothing was measured on hardware. A floor is the modeled "
        "time of only the instructions this design cannot do without, at the hardware's "
        "instruction granularity, plus the useful bytes (what is counted and what is left out: "
        "the docstring of `scripts/bench_floors.py`); no kernel of the design models faster. "
        "Efficiency = useful-work roofline / modeled time, rounded down; H=32, Hkv=8, d=128, "
        "bf16, block 32, one NeuronCore.", "", table(rows), "",
        "Busy time per engine and shared port (trn1: VectorE + ScalarE take turns on PSUM, "
        "VectorE + GpSimd on SBUF; trn2: VectorE's performance mode shares GpSimd's bus), "
        "shipped kernel us / floor us: where the shipped kernel's distance to the floor is.", "",
        engine_table(rows), ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, quick_help="the two small batches of bench_paged_attention --quick")
    add_markdown_arg(ap)
    ap.add_argument("--targets", nargs="+", choices=tuple(TARGETS), default=list(TARGETS))
    ap.add_argument("--no-shipped", action="store_true",
                    help="floors only (no kernel run for the shipped column)")
    a = parse_args(ap, argv)
    t0 = time.perf_counter()
    rows = bench(a.quick, a.targets, shipped=not a.no_shipped)
    print(table(rows))
    print(f"(wall time {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    write_json(a, __file__, rows, times="MODELED")
    write_markdown(a, __file__, argv, lambda cmd, commit: markdown(rows, a.quick, cmd, commit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
