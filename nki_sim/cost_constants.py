"""Constants of the cost model (``nki_sim/cost.py``): one frozen dataclass per target, each
field carrying its unit, its provenance (documented / derived / estimate / fitted) and its
source; :func:`constants_table` prints the table docs/cost-model.md shows."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

DOC, DERIVED, ESTIMATE = "documented", "derived", "estimate"
FIT = "fitted"       # fitted to published hardware profiles (docs/cost-model-validation.md)
STATUSES = (DOC, DERIVED, ESTIMATE, FIT)
# tensor_scalar forms ScalarE's activation datapath computes (func(in * scale + bias))
SCALAR_AFFINE = frozenset({("multiply",), ("add",), ("multiply", "add")})


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
    reciprocal_factor: float = _c(
        "x N", FIT, "trn1 profiles need 3.3 N (silu) and 3.8 N (adamw) VectorE cycles per"
        " nisa.reciprocal (after the static overhead); the docstring's max(MIN_II, 8N) is 2x too slow")
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
    dma_small_descriptor_bytes: float = _c(
        "B", DOC, "DMA bandwidth guide: >= 2 KiB of contiguous data per partition is the minimum"
        " recommended (256 B - 2 KiB: 'improving but still below peak')")
    dma_small_descriptor_efficiency: float = _c(
        "x", FIT, "byte rate of a descriptor below dma_small_descriptor_bytes, as a fraction of"
        " the engine bandwidth; trn1: AWS matmul tutorial tiled / hoist_load / block_free kernels"
        " (256 B and 1 KiB rows, about 100 GB/s measured), one publication; trn2 assumed alike")
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
    instruction_overhead_cycles: float = _c(
        "cycles", FIT, "per VectorE / ScalarE instruction beyond its formula; trn1 profiles:"
        " ScalarE silu 144, adamw 115, VectorE rope 108 (mean 122); perf guide: static"
        " instruction overhead ~100 cycles")
    dependent_issue_latency_cycles: float = _c(
        "cycles", DERIVED, "perf guide: dependent 1-element ScalarE instructions issue every 264"
        " ScalarE cycles on NeuronCore-v2 = MIN_II 64 + static overhead 120 + 80 cycles before a"
        " consumer on the same engine may read the result (VectorE and trn2 assumed alike)")
    sbuf_port_vector_gpsimd: float = _c(
        "0/1", DOC, "NKI arch guide, NeuronCore-v2: 'VectorE and GpSimdE cannot access SBUF in"
        " parallel' (the compiler serializes their SBUF instructions); lifted on NeuronCore-v3"
        " (Trainium2 arch guide)")
    perf_mode_bus_gpsimd: float = _c(
        "0/1", DOC, "Trainium2 arch guide: VectorE's performance mode uses a memory bus shared with"
        " GpSimdE, the hardware arbitrating between GpSimdE and those VectorE instructions"
        " (modeled as serialized); trn1 has no performance mode")
    psum_port_vector_scalar: float = _c(
        "0/1", DOC, "NKI arch guide, NeuronCore-v2: 'VectorE and ScalarE cannot access PSUM in"
        " parallel' (serialized); NeuronCore-v3: both at full bandwidth in parallel unless they"
        " hit the same PSUM bank (Trainium2 arch guide)")
    compiler_copies_on_scalar: float = _c(
        "0/1", FIT, "trn1 profiles (NKIBench bmm, rope, silu, adamw): nl.copy / compiler copies"
        " and tensor_scalar(engine unspecified, multiply/add) run on ScalarE; trn2 assumed alike")

    def clock_ghz(self, engine: str) -> float:
        """Clock of a compute engine in GHz (cycles per ns)."""
        return {"tensor": self.tensor_clock_ghz, "vector": self.vector_clock_ghz,
                "scalar": self.scalar_clock_ghz, "gpsimd": self.gpsimd_clock_ghz}[engine]

    @property
    def dma_peak_bytes_per_ns(self) -> float:
        """Practical peak of all DMA engines of the core, before the HBM-share cap."""
        return self.dma_engines * self.dma_engine_bw_bytes_per_ns

    def descriptor_rate_factor(self, nbytes):
        """Fraction of the engine's byte rate a descriptor of ``nbytes`` moves its bytes at:
        ``dma_small_descriptor_efficiency`` below ``dma_small_descriptor_bytes``, else 1
        (NumPy arrays elementwise)."""
        return np.where(np.asarray(nbytes) < self.dma_small_descriptor_bytes,
                        self.dma_small_descriptor_efficiency, 1.0)

    def descriptor_efficiency(self, nbytes: float) -> float:
        """Fraction of the engine bandwidth reached by back-to-back descriptors of nbytes."""
        t_ideal = nbytes / self.dma_engine_bw_bytes_per_ns
        t_data = t_ideal / float(self.descriptor_rate_factor(nbytes))
        return t_ideal / (t_data + self.dma_desc_overhead_ns)


TRN1 = HardwareConstants(
    name="trn1", tensor_clock_ghz=2.8, vector_clock_ghz=1.12, scalar_clock_ghz=1.4,
    gpsimd_clock_ghz=1.4, tensor_peak_tflops=2 * 128 * 128 * 2.8e-3, matmul_fp32_factor=4.0,
    transpose_fp32_factor=4.0, min_ii_cycles=64.0, activation_reduce_extra_cycles=64.0,
    reciprocal_factor=3.5, gpsimd_start_cycles=150.0, vector_perf_mode_factor=1.0,
    dma_engines=16, partitions_per_dma_engine=8, dma_engine_bw_bytes_per_ns=17.0,
    dma_desc_overhead_ns=256 / 17.0, dma_small_descriptor_bytes=2048.0,
    dma_small_descriptor_efficiency=0.45, dma_semaphore_bytes=4, dma_fixed_latency_ns=1300.0,
    dma_inflight=4.0, hwdge_ns_per_instruction=0.0, swdge_cores=8,
    swdge_cycles_per_descriptor=18.0, dma_transpose_efficiency_hbm=0.5,
    dma_transpose_efficiency_sbuf=0.5, hbm_bw_bytes_per_ns=410.0, overlap_inefficiency=0.1,
    instruction_overhead_cycles=120.0, dependent_issue_latency_cycles=80.0,
    sbuf_port_vector_gpsimd=1.0, perf_mode_bus_gpsimd=0.0, psum_port_vector_scalar=1.0,
    compiler_copies_on_scalar=1.0)

TRN2 = dataclasses.replace(
    TRN1, name="trn2", tensor_clock_ghz=2.4, vector_clock_ghz=0.96, scalar_clock_ghz=1.2,
    gpsimd_clock_ghz=1.2, tensor_peak_tflops=2 * 128 * 128 * 2.4e-3, transpose_fp32_factor=2.0,
    vector_perf_mode_factor=4.0, dma_engine_bw_bytes_per_ns=23.0, dma_desc_overhead_ns=256 / 23.0,
    hwdge_ns_per_instruction=600.0, dma_transpose_efficiency_hbm=0.9, hbm_bw_bytes_per_ns=362.5,
    sbuf_port_vector_gpsimd=0.0, perf_mode_bus_gpsimd=1.0, psum_port_vector_scalar=0.0)

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
