"""Analytical cost model for one NeuronCore (trn1 = NeuronCore-v2, trn2 = NeuronCore-v3).

Input: the simulator trace (``nki_sim.tracing()``; the fields of ``nki_sim.trace.Event``), or any
iterable of objects with the same attribute names. Output: a frozen :class:`CostReport` of MODELED figures.
Nothing here is a measurement; docs/cost-model.md explains the model and prints the constants table
(:func:`constants_table`). Every constant lives in one frozen dataclass per target
(:data:`TRN1`, :data:`TRN2`), each field carrying its unit, its source and whether it is
documented, derived or an estimate.

Model (all SPMD programs of the trace run on ONE physical NeuronCore, summed):

* Compute engines (tensor/vector/scalar/gpsimd): per instruction, the documented cycle formula
  (:func:`compute_cycles`), divided by the engine clock; summed per engine.
* DMA, per instruction (:func:`dma_instruction_cost`): descriptors (``Event.descriptor_bytes``) are
  mapped to DMA engines by on-chip partition (8 partitions per engine, up to 16 engines; the first
  engine rotates between instructions so that small transfers spread over the 16 engines). An
  engine spends ``t_desc + bytes / bw_engine`` per descriptor, and every instruction costs each of
  the 16 engines one 4-byte semaphore write. A direct DMA whose HBM side is one contiguous range
  (attr ``hbm_contiguous``) moves one merged descriptor per engine, as AWS's trn2 profile shows.
  Latency of the instruction = fixed DMA latency + descriptor generation (hardware DGE on trn2,
  software DGE on GpSimd for indirect DMAs, which is also GpSimd busy time) + its slowest engine.
  The DMA resource time is ``max(busiest DMA engine, sum(latency) / dma_inflight,
  HBM bytes / HBM bandwidth per core)`` (the middle term is Little's law with a bounded number of
  transfers in flight).
* ``lower_bound_us`` = busiest resource; ``upper_bound_us`` = sum of all resources plus the
  fill/drain latency below (no overlap at all);
  ``modeled_us`` = busiest + ``overlap_inefficiency`` * (sum of the others) + exposed latency of
  the first and the last DMA instruction (pipeline fill and drain). The trace has no buffer
  identities, so a dependency-aware schedule is not possible; this closed form is the stand-in.
* ``roofline_us`` = max(HBM bytes / HBM bandwidth per core, FLOPs / TensorE peak);
  ``fraction_of_roofline`` = roofline_us / modeled_us (<= 1 by construction).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import numpy as np

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
_MATMUL_OPS = frozenset({"nc_matmul", "matmul"})
_TRANSPOSE_OPS = frozenset({"nc_transpose", "transpose"})
_PERF_MODE_OPS = frozenset({"tensor_copy", "tensor_scalar", "copy"})
_HALF_DTYPES = frozenset({"bfloat16", "float16"})

DOC, DERIVED, ESTIMATE = "documented", "derived", "estimate"


def _c(unit: str, status: str, source: str):
    """A constant field: unit, provenance status and source travel with it (see constants_table)."""
    return field(metadata={"unit": unit, "status": status, "source": source})


@dataclass(frozen=True)
class HardwareConstants:
    """All constants of the model for one target; one instance per target (TRN1, TRN2)."""

    name: str = field(metadata={"unit": "", "status": DOC, "source": "target name"})
    tensor_clock_ghz: float = _c("GHz", DOC, "NKI arch guides (trn1 2.8, trn2 2.4)")
    vector_clock_ghz: float = _c("GHz", DOC, "NKI arch guides (trn1 1.12, trn2 0.96)")
    scalar_clock_ghz: float = _c("GHz", DOC, "NKI arch guides (trn1 1.4, trn2 1.2)")
    gpsimd_clock_ghz: float = _c("GHz", DOC, "NKI arch guides (trn1 1.4, trn2 1.2)")
    tensor_peak_tflops: float = _c(
        "TFLOPS", DERIVED, "2 x 128 x 128 x TensorE clock (docs: ~92 trn1, 79 trn2 bf16)")
    matmul_fp32_factor: float = _c("x", DOC, "nc_matmul docstring: fp32 is 4x the bf16 cost")
    transpose_fp32_factor: float = _c(
        "x", DOC, "trn2 arch guide: TensorE transpose mode 2x faster for fp32 (trn1: matmul 4x)")
    min_ii_cycles: float = _c("cycles", DOC, "nki.isa docstrings: MIN_II ~64 (Vector/Scalar)")
    activation_reduce_extra_cycles: float = _c("cycles", DOC, "activation_reduce: +MIN_II")
    reciprocal_factor: float = _c("x N", DOC, "nisa.reciprocal (VectorE): max(MIN_II, 8N)")
    gpsimd_start_cycles: float = _c("cycles", DOC, "iota/affine_select: 150 + N (GPSIMD_START)")
    vector_perf_mode_factor: float = _c(
        "x", DOC, "trn2 arch guide: VectorE perf mode 4x for bf16/fp16 tensor_copy/tensor_scalar"
        " on SBUF (trn1: none)")
    dma_engines: int = _c("engines", DOC, "DMA overview: 16 DMA engines per NeuronCore (v2-v4)")
    partitions_per_dma_engine: int = _c("partitions", DOC, "DMA overview: 128 / 16 = 8")
    dma_engine_bw_bytes_per_ns: float = _c(
        "B/ns", DOC, "DMA bandwidth guide, practical per engine (trn1 17, trn2 23; rated 27.2)")
    dma_desc_overhead_ns: float = _c(
        "ns", ESTIMATE, "chosen = 256 B / bw_engine, so a 256 B descriptor runs at 50% and a"
        " 4 KiB one at 94% (guide: <256 B overhead-bound, >=4 KiB near peak)")
    dma_semaphore_bytes: int = _c(
        "B", DOC, "DMA overview: every engine writes a 4 B semaphore per transfer")
    dma_fixed_latency_ns: float = _c(
        "ns", DOC, "DMA bandwidth guide: ~1300 ns setup + sync + semaphore-to-start per transfer")
    dma_inflight: float = _c(
        "transfers", ESTIMATE, "DMA transfers whose latencies overlap (16 queues, round robin;"
        " the usable depth is not published)")
    hwdge_ns_per_instruction: float = _c(
        "ns", DOC, "trn2 arch guide / DGE doc: ~600 ns per hardware-DGE DMA (trn1: static"
        " descriptors, 0)")
    swdge_cores: int = _c("cores", DOC, "GpSimd: 8 cores, each wired to 16 partitions")
    swdge_cycles_per_descriptor: float = _c(
        "cycles/core", ESTIMATE, "fitted: 128-row swdge transfer spans 468 ns on trn2 (DMA"
        " overview) = 97 ns transfer + (150 + 18 x 128/8) cycles at 1.2 GHz")
    dma_transpose_efficiency_hbm: float = _c(
        "x", DOC, "trn2 arch guide: DMA transpose up to 90% HBM->SBUF (trn1: estimate 0.5)")
    dma_transpose_efficiency_sbuf: float = _c(
        "x", DOC, "trn2 arch guide: DMA transpose up to 50% SBUF->SBUF")
    hbm_bw_bytes_per_ns: float = _c(
        "GB/s", DERIVED, "HBM per chip / physical cores: trn1 820/2 = 410, trn2 2900/8 = 362.5")
    overlap_inefficiency: float = _c(
        "x", ESTIMATE, "beta in modeled = busiest + beta * sum(others) + fill/drain latency")

    def clock_ghz(self, engine: str) -> float:
        """Clock of a compute engine in GHz (cycles per ns)."""
        return {"tensor": self.tensor_clock_ghz, "vector": self.vector_clock_ghz,
                "scalar": self.scalar_clock_ghz, "gpsimd": self.gpsimd_clock_ghz}[engine]

    @property
    def dma_peak_bytes_per_ns(self) -> float:
        """Practical peak of all DMA engines of the core, before the HBM-share cap."""
        return self.dma_engines * self.dma_engine_bw_bytes_per_ns

    def descriptor_efficiency(self, nbytes: float) -> float:
        """Fraction of the engine bandwidth reached by back-to-back descriptors of nbytes."""
        t_data = nbytes / self.dma_engine_bw_bytes_per_ns
        return t_data / (t_data + self.dma_desc_overhead_ns)


TRN1 = HardwareConstants(
    name="trn1", tensor_clock_ghz=2.8, vector_clock_ghz=1.12, scalar_clock_ghz=1.4,
    gpsimd_clock_ghz=1.4, tensor_peak_tflops=2 * 128 * 128 * 2.8e-3, matmul_fp32_factor=4.0,
    transpose_fp32_factor=4.0, min_ii_cycles=64.0, activation_reduce_extra_cycles=64.0,
    reciprocal_factor=8.0, gpsimd_start_cycles=150.0, vector_perf_mode_factor=1.0,
    dma_engines=16, partitions_per_dma_engine=8, dma_engine_bw_bytes_per_ns=17.0,
    dma_desc_overhead_ns=256 / 17.0, dma_semaphore_bytes=4, dma_fixed_latency_ns=1300.0,
    dma_inflight=4.0, hwdge_ns_per_instruction=0.0, swdge_cores=8,
    swdge_cycles_per_descriptor=18.0, dma_transpose_efficiency_hbm=0.5,
    dma_transpose_efficiency_sbuf=0.5, hbm_bw_bytes_per_ns=410.0, overlap_inefficiency=0.1)

TRN2 = dataclasses.replace(
    TRN1, name="trn2", tensor_clock_ghz=2.4, vector_clock_ghz=0.96, scalar_clock_ghz=1.2,
    gpsimd_clock_ghz=1.2, tensor_peak_tflops=2 * 128 * 128 * 2.4e-3, transpose_fp32_factor=2.0,
    vector_perf_mode_factor=4.0, dma_engine_bw_bytes_per_ns=23.0, dma_desc_overhead_ns=256 / 23.0,
    hwdge_ns_per_instruction=600.0, dma_transpose_efficiency_hbm=0.9, hbm_bw_bytes_per_ns=362.5)

CONSTANTS: Mapping[str, HardwareConstants] = MappingProxyType({"trn1": TRN1, "trn2": TRN2})


def get_constants(target: Any = "trn2") -> HardwareConstants:
    """Constants for ``target``: "trn1"/"trn2", a HardwareConstants, or an object with ``.name``."""
    if isinstance(target, HardwareConstants):
        return target
    name = getattr(target, "name", target)
    if name not in CONSTANTS:
        raise ValueError(f"target must be one of {sorted(CONSTANTS)}; got {target!r}")
    return CONSTANTS[name]


def constants_table(markdown: bool = True) -> str:
    """The single constants table (both targets side by side) as Markdown or tab-separated text."""
    rows = [("constant", "trn1", "trn2", "unit", "status", "source")]
    for f in dataclasses.fields(HardwareConstants):
        if f.name == "name":
            continue
        v1, v2 = getattr(TRN1, f.name), getattr(TRN2, f.name)
        rows.append((f.name, f"{v1:.4g}", f"{v2:.4g}", f.metadata["unit"], f.metadata["status"],
                     f.metadata["source"]))
    if not markdown:
        return "\n".join("\t".join(r) for r in rows)
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


@dataclass(frozen=True)
class ApiConstants:
    """Constants of the events the current ``nki`` API adds (one set for both targets)."""

    fori_iteration_ns: float = field(default=9000.0, metadata={
        "unit": "ns", "status": DOC, "source": "nki-library dynamic_fa_design_spec: ~9 us scheduling"
        " barrier per nl.fori_loop iteration, no prefetch across iterations"})
    dma_transpose_4byte_factor: float = field(default=0.5, metadata={
        "unit": "x", "status": ESTIMATE, "source": "DMA transpose is a 2-byte-element hardware mode;"
        " 4-byte elements modeled at half its throughput (not published)"})
    lnc_launch_ns: float = field(default=0.0, metadata={
        "unit": "ns", "status": ESTIMATE, "source": "logical-core launch / barrier overhead: not"
        " published, modeled as 0 (launch time = the slower core)"})


API = ApiConstants()


def api_constants_table() -> str:
    """Markdown table of :data:`API` (the current-API event constants)."""
    lines = ["| constant | value | unit | status | source |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(ApiConstants):
        m = f.metadata
        lines.append(f"| {f.name} | {getattr(API, f.name):.4g} | {m['unit']} | {m['status']} | {m['source']} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# per-instruction costs
# ----------------------------------------------------------------------------------------------
def _attr(ev: Any, key: str, default: Any = None) -> Any:
    for k, v in getattr(ev, "attrs", ()) or ():
        if k == key:
            return v
    return default


def _matmul_dims(ev: Any) -> tuple[int, int, int]:
    """(K, M, N) of a TensorE matmul/transpose event, from attrs or, failing that, in_shapes."""
    k, m, n = (_attr(ev, "contraction"), _attr(ev, "stationary_free"), _attr(ev, "moving_free"))
    if None in (k, m, n):
        shapes = tuple(getattr(ev, "in_shapes", ()))
        if len(shapes) < 2 or len(shapes[0]) < 2 or len(shapes[1]) < 2:
            raise ValueError(f"matmul event {getattr(ev, 'seq', '?')} needs attrs contraction/"
                             f"stationary_free/moving_free or 2-D in_shapes; got {shapes!r}")
        k, m, n = shapes[0][0], math.prod(shapes[0][1:]), math.prod(shapes[1][1:])
    return int(k), int(m), int(n)


def matmul_flops(ev: Any) -> int:
    """2*K*M*N for nc_matmul/matmul events (transposes are data movement: 0 FLOPs)."""
    if getattr(ev, "op", "") not in _MATMUL_OPS:
        return 0
    k, m, n = _matmul_dims(ev)
    return 2 * k * m * n


def _is_fp32_mm(ev: Any) -> bool:
    fp32 = _attr(ev, "fp32")
    if fp32 is None:
        fp32 = any(d == "float32" for d in getattr(ev, "in_dtypes", ()))
    return bool(fp32)


def compute_cycles(ev: Any, hw: HardwareConstants) -> float:
    """Engine cycles of one compute instruction from the documented formulas (N = free_elems)."""
    engine, op = ev.engine, ev.op
    n = float(max(int(getattr(ev, "free_elems", 0)), 0))
    ii = hw.min_ii_cycles
    in_dtypes = tuple(getattr(ev, "in_dtypes", ()))
    if engine == "tensor":
        if op in _MATMUL_OPS or op in _TRANSPOSE_OPS:
            _, m, nm = _matmul_dims(ev)
            cycles = max(min(64.0, m), float(nm))
            if _is_fp32_mm(ev):
                cycles *= hw.transpose_fp32_factor if op in _TRANSPOSE_OPS else hw.matmul_fp32_factor
            return cycles
        return max(ii, n)
    if engine == "gpsimd":
        return hw.gpsimd_start_cycles + n
    if engine == "scalar":
        extra = hw.activation_reduce_extra_cycles if (
            op == "activation_reduce" or _attr(ev, "reduce")) else 0.0
        return max(ii, n) + extra
    if engine == "vector":
        half = bool(in_dtypes) and all(d in _HALF_DTYPES for d in in_dtypes)
        from_psum = getattr(ev, "src_buffer", "") == "psum" or bool(_attr(ev, "psum_input"))
        if op == "reciprocal":
            return max(ii, hw.reciprocal_factor * n)
        if op in ("tensor_tensor", "tensor_tensor_scan") and not (
                op == "tensor_tensor" and (from_psum or half)):
            return max(ii, 2.0 * n)
        if op == "tensor_reduce":
            return n / 2.0 if half else n
        if op in _PERF_MODE_OPS and half and getattr(ev, "out_dtype", "") in _HALF_DTYPES \
                and not from_psum:
            return max(ii, n / hw.vector_perf_mode_factor)
        return max(ii, n)
    raise ValueError(f"event engine must be one of {ENGINES}; got {engine!r} (op {op!r})")


@dataclass(frozen=True)
class DmaCost:
    """Cost of one DMA instruction. engine_ns: (16,) busy ns per DMA engine (semaphores included);
    transfer_ns: (16,) payload-only part; latency_ns: issue -> completion; gpsimd_ns: swdge work."""

    engine_ns: np.ndarray
    transfer_ns: np.ndarray
    latency_ns: float
    gpsimd_ns: float
    descriptors: int
    engines_used: int


def _descriptor_partitions(n_desc: int, partitions: int) -> np.ndarray:
    """On-chip partition of each descriptor, descriptors being in partition order."""
    return (np.arange(n_desc, dtype=np.int64) * partitions) // max(n_desc, 1)


def dma_instruction_cost(ev: Any, hw: HardwareConstants, first_engine: int = 0) -> DmaCost:
    """Cost of one DMA Event; ``first_engine`` rotates where a narrow transfer lands."""
    partitions = max(int(getattr(ev, "partitions", 1) or 1), 1)
    is_transpose = getattr(ev, "op", "") in ("dma_transpose", "load_transpose2d") or bool(
        _attr(ev, "transpose", False))
    trace_descs = getattr(ev, "descriptor_bytes", ()) or ()
    descs = np.zeros(0) if is_transpose else np.asarray(trace_descs, dtype=np.float64)
    if (descs.size == 0 or is_transpose) and int(getattr(ev, "bytes", 0)) > 0:
        # no descriptor list, or a DMA transpose: a hardware mode of the DMA engines (trn2)
        # whose element-sized "runs" are not descriptors; modeled as one row per partition
        # at the documented transpose throughput (below).
        descs = np.full(partitions, int(ev.bytes) / partitions)
    n_eng = hw.dma_engines
    per_engine = max(hw.partitions_per_dma_engine, math.ceil(partitions / n_eng))
    engines_used = max(1, min(n_eng, math.ceil(partitions / per_engine)))
    rel = _descriptor_partitions(descs.size, partitions) // per_engine
    eng = (first_engine + rel) % n_eng
    kind = getattr(ev, "dma_kind", "") or "direct"
    if kind == "direct" and bool(_attr(ev, "hbm_contiguous", False)) and descs.size:
        descs = np.bincount(eng, weights=descs, minlength=n_eng)   # one merged descriptor/engine
        eng = np.flatnonzero(descs)
        descs = descs[eng]
    bw = hw.dma_engine_bw_bytes_per_ns
    if is_transpose:
        on_chip = "hbm" not in (getattr(ev, "src_buffer", ""), getattr(ev, "dst_buffer", ""))
        bw *= hw.dma_transpose_efficiency_sbuf if on_chip else hw.dma_transpose_efficiency_hbm
        if getattr(ev, "out_dtype", "") in ("float32", "int32", "uint32"):
            bw *= API.dma_transpose_4byte_factor
    transfer = np.bincount(eng, weights=hw.dma_desc_overhead_ns + descs / bw, minlength=n_eng)
    semaphore = hw.dma_desc_overhead_ns + hw.dma_semaphore_bytes / hw.dma_engine_bw_bytes_per_ns
    engine_ns = transfer + semaphore
    # descriptors as modeled: the trace's count (before per-engine merging); for a DMA
    # transpose, one per partition (see above)
    n_desc = partitions if is_transpose else int(len(trace_descs) or descs.size)
    dge = _attr(ev, "dge")        # the current API's dge_mode, when the kernel names one
    if dge is None and _attr(ev, "scalar_offset") and hw.hwdge_ns_per_instruction == 0.0:
        dge = "swdge"             # runtime offsets without hardware DGE: descriptors on GpSimd
    if kind == "indirect" or dge == "swdge":
        rows = n_desc + int(getattr(ev, "skipped_rows", 0) or 0)
        gen_cycles = hw.gpsimd_start_cycles + hw.swdge_cycles_per_descriptor * math.ceil(
            rows / hw.swdge_cores)
        gpsimd_ns = gen_cycles / hw.gpsimd_clock_ghz
        gen_ns = gpsimd_ns
    elif dge == "none":           # descriptors precomputed on the host
        gpsimd_ns, gen_ns = 0.0, 0.0
    else:
        gpsimd_ns, gen_ns = 0.0, hw.hwdge_ns_per_instruction
    latency = hw.dma_fixed_latency_ns + gen_ns + float(engine_ns.max())
    return DmaCost(engine_ns, transfer, latency, gpsimd_ns, n_desc, engines_used)


# ----------------------------------------------------------------------------------------------
# whole-trace estimate
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostReport:
    """Modeled cost of a trace on one NeuronCore. Times in microseconds; all figures MODELED."""

    target: str
    per_engine_us: Mapping[str, float]   # tensor, vector, scalar, gpsimd, dma
    lower_bound_us: float                # busiest engine
    upper_bound_us: float                # sum of all engines + fill/drain latency (no overlap)
    modeled_us: float                    # busiest + beta * others + DMA fill/drain latency
    hbm_bytes: int
    flops: int
    roofline_us: float                   # max(HBM bytes / HBM BW per core, FLOPs / TensorE peak)
    fraction_of_roofline: float          # roofline_us / modeled_us
    dma_instructions: int = 0
    dma_descriptors: int = 0
    dma_bytes: int = 0
    dma_engine_max_us: float = 0.0       # busiest of the 16 DMA engines
    dma_queue_us: float = 0.0            # sum(DMA latency) / dma_inflight
    dma_hbm_cap_us: float = 0.0          # HBM bytes / HBM bandwidth per core
    exposed_latency_us: float = 0.0      # fill + drain latency added to modeled_us
    instructions: Mapping[str, int] = field(default_factory=dict)
    sync_us: float = 0.0                 # fori_loop iteration barriers (added serially)
    method: str = ("modeled_us = busiest engine + overlap_inefficiency * sum(other engines)"
                   " + latency of the first and the last DMA instruction")

    @property
    def bottleneck(self) -> str:
        """Name of the busiest engine."""
        return max(self.per_engine_us, key=self.per_engine_us.get)

    def as_dict(self) -> dict:
        """Plain dict (JSON-serialisable)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["per_engine_us"] = dict(self.per_engine_us)
        d["instructions"] = dict(self.instructions)
        d["bottleneck"] = self.bottleneck
        return d


def estimate(trace_or_events: Any, target: Any = "trn2") -> CostReport:
    """Model the cost of a trace (``nki_sim.trace.Trace`` or iterable of Events) on ``target``."""
    hw = get_constants(target)
    events: Iterable[Any] = getattr(trace_or_events, "events", trace_or_events)
    busy_ns = dict.fromkeys(ENGINES[:-1], 0.0)
    counts = dict.fromkeys(ENGINES, 0)
    dma_engine_ns = np.zeros(hw.dma_engines)
    latency_sum = first_lat = last_lat = 0.0
    hbm_bytes = dma_bytes = flops = n_desc = 0
    compute_floor_ns = 0.0
    rotation = 0
    sync_ns = 0.0
    for ev in events:
        engine = getattr(ev, "engine", None)
        if engine == "sync" and getattr(ev, "op", "") == "loop_iteration":
            # nl.fori_loop / while_loop iteration barrier (serial)
            sync_ns += API.fori_iteration_ns
            continue
        if engine not in ENGINES:
            raise ValueError(f"event engine must be one of {ENGINES}; got {engine!r}")
        counts[engine] += 1
        if engine == "dma":
            cost = dma_instruction_cost(ev, hw, rotation)
            rotation = (rotation + cost.engines_used) % hw.dma_engines
            dma_engine_ns += cost.engine_ns
            busy_ns["gpsimd"] += cost.gpsimd_ns
            latency_sum += cost.latency_ns
            if counts["dma"] == 1:
                first_lat = cost.latency_ns
            last_lat = cost.latency_ns
            nbytes = int(getattr(ev, "bytes", 0))
            dma_bytes += nbytes
            n_desc += cost.descriptors
            hbm_bytes += nbytes * sum(b == "hbm" for b in (ev.src_buffer, ev.dst_buffer))
            continue
        busy_ns[engine] += compute_cycles(ev, hw) / hw.clock_ghz(engine)
        f = matmul_flops(ev)
        if f:
            flops += f
            slow = hw.matmul_fp32_factor if _is_fp32_mm(ev) else 1.0
            compute_floor_ns += f * slow / (hw.tensor_peak_tflops * 1e3)
    hbm_cap_ns = hbm_bytes / hw.hbm_bw_bytes_per_ns
    queue_ns = latency_sum / hw.dma_inflight
    engine_max_ns = float(dma_engine_ns.max()) if counts["dma"] else 0.0
    busy_ns["dma"] = max(engine_max_ns, queue_ns, hbm_cap_ns)
    per_engine_us = {e: busy_ns[e] / 1e3 for e in ENGINES}
    lower = max(per_engine_us.values())
    total = sum(per_engine_us.values())
    exposed = (first_lat + (last_lat if counts["dma"] > 1 else 0.0)) / 1e3
    modeled = lower + hw.overlap_inefficiency * (total - lower) + exposed + sync_ns / 1e3
    upper = total + exposed + sync_ns / 1e3
    roofline = max(hbm_cap_ns, compute_floor_ns) / 1e3
    return CostReport(
        target=hw.name, per_engine_us=MappingProxyType(per_engine_us), lower_bound_us=lower,
        upper_bound_us=upper, modeled_us=modeled, hbm_bytes=hbm_bytes, flops=flops,
        roofline_us=roofline, fraction_of_roofline=(roofline / modeled) if modeled > 0 else 0.0,
        dma_instructions=counts["dma"], dma_descriptors=n_desc, dma_bytes=dma_bytes,
        dma_engine_max_us=engine_max_ns / 1e3, dma_queue_us=queue_ns / 1e3,
        dma_hbm_cap_us=hbm_cap_ns / 1e3, exposed_latency_us=exposed,
        instructions=MappingProxyType(counts), sync_us=sync_ns / 1e3)


@dataclass(frozen=True)
class LaunchReport:
    """A logical-core launch (LNC=2): one CostReport per core; the launch takes as long as the
    slower core (plus :data:`API` ``lnc_launch_ns``).  All figures MODELED."""

    per_core: Mapping[int, CostReport]
    launch_us: float
    slowest_core: int


def estimate_cores(trace_or_events: Any, target: Any = "trn2") -> LaunchReport:
    """Model each logical core of a trace separately (events carry their core in ``attrs``
    ``core``; events without one belong to core 0)."""
    events = list(getattr(trace_or_events, "events", trace_or_events))
    cores: dict = {}
    for ev in events:
        cores.setdefault(int(_attr(ev, "core", 0) or 0), []).append(ev)
    per = {c: estimate(evs, target) for c, evs in sorted(cores.items())}
    if not per:
        per = {0: estimate([], target)}
    slow = max(per, key=lambda c: per[c].modeled_us)
    return LaunchReport(MappingProxyType(per), per[slow].modeled_us + API.lnc_launch_ns / 1e3, slow)
