"""Analytical cost model for one NeuronCore (trn1 = NeuronCore-v2, trn2 = NeuronCore-v3).

Input: the simulator trace (``nki_sim.tracing()``; the fields of ``nki_sim.trace.Event``), or any
iterable of objects with the same attribute names. Output: a frozen :class:`CostReport` of MODELED figures.
Nothing here is a measurement; docs/cost-model.md explains the model and prints the constants table
(:func:`constants_table`). Every constant lives in one frozen dataclass per target
(:data:`TRN1`, :data:`TRN2`), each field carrying its unit, its source and whether it is
documented, derived or an estimate.

Model (all SPMD programs of a launch on one physical NeuronCore are summed; a launch on both
cores of a logical core, events tagged ``core``, takes as long as its slower core; the trace's
kernel launches, ``Event.launch``, run one after the other and their reports add up):

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
* Shared ports (:func:`instruction_ports`): on NeuronCore-v2 VectorE and GpSimdE cannot reach
  SBUF at the same time, nor VectorE and ScalarE PSUM (the compiler serializes them); on
  NeuronCore-v3 VectorE's performance mode borrows GpSimdE's bus. A port is a resource whose
  busy time is the sum of the instructions that hold it (``CostReport.port_us``).
* ``lower_bound_us`` = busiest resource (engine or port); ``upper_bound_us`` = sum of all
  engines plus the fill/drain latency below (no overlap at all); ``modeled_us`` = busiest +
  ``overlap_inefficiency`` * (the engine time outside it) + exposed latency of the first and
  the last DMA instruction (pipeline fill and drain). The trace has no buffer
  identities, so a dependency-aware schedule is not possible; this closed form is the stand-in.
* ``roofline_us`` = max(HBM bytes / HBM bandwidth per core, FLOPs / TensorE peak);
  ``fraction_of_roofline`` = roofline_us / modeled_us (<= 1 by construction).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable

import numpy as np

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
_MATMUL_OPS = frozenset({"nc_matmul", "matmul"})
_TRANSPOSE_OPS = frozenset({"nc_transpose", "transpose"})
_PERF_MODE_OPS = frozenset({"tensor_copy", "tensor_scalar", "copy"})
_HALF_DTYPES = frozenset({"bfloat16", "float16"})

# constants live in nki_sim/cost_constants.py; nki_sim.cost is the public module (re-exported)
from .cost_constants import (  # noqa: E402,F401
    API, CONSTANTS, DERIVED, DOC, ESTIMATE, FIT, STATUSES, TRN1, TRN2, ApiConstants,
    HardwareConstants, api_constants_table, constants_table, get_constants)
from .cost_constants import SCALAR_AFFINE as _SCALAR_AFFINE  # noqa: E402
from .cost_report import CostReport, LaunchReport, combine  # noqa: E402,F401
from .trace import split_launches  # noqa: E402


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


def assigned_engine(ev: Any, hw: HardwareConstants) -> str:
    """Engine the instruction is charged to. The trace records the simulator's engine; where the
    compiler picks (``nl.copy`` and the copies it inserts, ``nisa.tensor_scalar`` without
    ``engine=`` whose ops ScalarE's ``in * scale + bias`` datapath computes), trn1 profiles show
    ScalarE doing the work (``compiler_copies_on_scalar``)."""
    engine = ev.engine
    if engine != "vector" or not hw.compiler_copies_on_scalar:
        return engine
    op = ev.op
    if op == "copy" and not _attr(ev, "staging_for"):      # (the inferred affine_select staging
        return "scalar"                                   # copy stays on VectorE, README rule 3)
    if op == "tensor_copy" and _attr(ev, "engine_unspecified"):     # nl.copy in either API
        return "scalar"
    if op == "tensor_scalar" and _attr(ev, "engine_unspecified") and \
            tuple(_attr(ev, "ops") or ()) in _SCALAR_AFFINE:
        return "scalar"
    return engine


def compute_cycles(ev: Any, hw: HardwareConstants, engine: str | None = None) -> float:
    """Engine cycles of one compute instruction: the documented formula (N = free_elems) plus,
    on VectorE / ScalarE, the static per-instruction overhead; on ``engine`` (default:
    :func:`assigned_engine`)."""
    engine = assigned_engine(ev, hw) if engine is None else engine
    cycles = formula_cycles(ev, hw, engine)
    if engine in ("vector", "scalar"):
        cycles += hw.instruction_overhead_cycles
    return cycles


def formula_cycles(ev: Any, hw: HardwareConstants, engine: str | None = None) -> float:
    """Cycles of the documented per-instruction formula alone (no static overhead)."""
    engine = assigned_engine(ev, hw) if engine is None else engine
    op = ev.op
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
        if op == "tensor_tensor" and _attr(ev, "nl"):        # an nl binary op of two tiles:
            return max(ii, n)                                # trn1 profiles (docs/cost-model.md)
        if op == "tensor_tensor":
            return max(ii, n if (from_psum or _tensor_tensor_fast(ev, in_dtypes)) else 2.0 * n)
        if op == "tensor_tensor_scan":
            return max(ii, 2.0 * n)
        if op == "scalar_tensor_tensor":    # as the tensor_tensor of its op1 (docstring)
            tiles = (in_dtypes[0], in_dtypes[-1]) if in_dtypes else ()
            return max(ii, n if (from_psum or _tensor_tensor_fast(ev, tiles)) else 2.0 * n)
        if op == "tensor_scalar_reduce":                     # docstring: max(MIN_II, N) + MIN_II
            return max(ii, n) + ii
        if op == "bn_aggr":                                  # docstring: max(MIN_II, 13 * N / 3)
            return max(ii, 13.0 * n / 3.0)
        if op == "tensor_reduce":        # MIN_II applies to every VectorE instruction
            return max(ii, n / 2.0 if half else n)
        if vector_perf_mode(ev, hw):
            return max(ii, n / hw.vector_perf_mode_factor)
        return max(ii, n)
    raise ValueError(f"event engine must be one of {ENGINES}; got {engine!r} (op {op!r})")


_TT_FAST_ALU = frozenset({"add", "multiply", "subtract"})

# shared on-chip access paths (``HardwareConstants``: sbuf_port_vector_gpsimd,
# perf_mode_bus_gpsimd, psum_port_vector_scalar): the engines of a port take turns
PORTS = ("vector+gpsimd", "vector+scalar")


def vector_perf_mode(ev: Any, hw: HardwareConstants) -> bool:
    """Whether a VectorE instruction runs in the performance mode (:func:`formula_cycles`: bf16 /
    fp16 tensor_copy / tensor_scalar, SBUF to SBUF, on a target with a mode factor > 1)."""
    in_dtypes = tuple(getattr(ev, "in_dtypes", ()))
    return (hw.vector_perf_mode_factor > 1.0 and ev.op in _PERF_MODE_OPS and bool(in_dtypes)
            and all(d in _HALF_DTYPES for d in in_dtypes)
            and getattr(ev, "out_dtype", "") in _HALF_DTYPES
            and not (getattr(ev, "src_buffer", "") == "psum" or _attr(ev, "psum_input")))


def instruction_ports(ev: Any, engine: str, hw: HardwareConstants) -> tuple[str, ...]:
    """The shared access paths (:data:`PORTS`) a compute instruction on ``engine`` holds while it
    runs. NeuronCore-v2: VectorE and GpSimdE take turns on SBUF, VectorE and ScalarE on PSUM;
    NeuronCore-v3: VectorE's performance-mode instructions share GpSimdE's bus. GpSimdE reaches
    SBUF only; an instruction whose buffers the event does not name is taken to touch SBUF."""
    src, dst = getattr(ev, "src_buffer", "") or "", getattr(ev, "dst_buffer", "") or ""
    psum = src == "psum" or dst == "psum" or bool(_attr(ev, "psum_input"))
    sbuf = (src == "sbuf" or dst == "sbuf" or bool(_attr(ev, "sbuf_input"))
            or not (src or dst))
    ports = []
    if engine == "gpsimd":
        if hw.sbuf_port_vector_gpsimd or hw.perf_mode_bus_gpsimd:
            ports.append("vector+gpsimd")
    elif engine == "vector":
        if (hw.sbuf_port_vector_gpsimd and sbuf) or (
                hw.perf_mode_bus_gpsimd and vector_perf_mode(ev, hw)):
            ports.append("vector+gpsimd")
        if hw.psum_port_vector_scalar and psum:
            ports.append("vector+scalar")
    elif engine == "scalar" and hw.psum_port_vector_scalar and psum:
        ports.append("vector+scalar")
    return tuple(ports)


def _tensor_tensor_fast(ev: Any, in_dtypes) -> bool:
    """The SBUF-only case that the nki.isa.tensor_tensor docstring charges N (not 2N) VectorE
    cycles: input and output dtypes all bfloat16, the operator add / multiply / subtract, the
    input data contiguous along the free dimension (event attrs ``alu``, ``strided``)."""
    return (bool(in_dtypes) and all(d == "bfloat16" for d in in_dtypes)
            and getattr(ev, "out_dtype", "") == "bfloat16" and _attr(ev, "alu") in _TT_FAST_ALU
            and not _attr(ev, "strided"))


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
    bw = bw * hw.descriptor_rate_factor(descs)      # below 2 KiB a descriptor moves bytes slower
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
def estimate(trace_or_events: Any, target: Any = "trn2") -> CostReport:
    """Model the cost of a trace (``nki_sim.trace.Trace`` or iterable of Events) on ``target``.

    Kernel launches run one after the other: each launch (``Event.launch``) is modeled on its
    own (its busiest resource, overlap and DMA fill / drain) and the launches' reports are
    summed (:func:`combine`), so two launches with different bottlenecks -- a decode class
    bound by DMA and a prefill class bound by ScalarE -- never overlap in the model. A launch
    on both physical cores of a logical core (events tagged ``core``) takes as long as its
    slower core: its report is that core's (plus :data:`API` ``lnc_launch_ns``), so
    ``modeled_us`` equals :func:`estimate_cores`' ``launch_us``; :func:`estimate_cores` gives
    every core's report, and ``combine(list(estimate_cores(...).per_core.values()))`` the
    bytes, FLOPs and instruction counts of all cores."""
    hw = get_constants(target)
    events = getattr(trace_or_events, "events", trace_or_events)
    reports = []
    for evs in split_launches(events) or [[]]:
        per_core = _launch_cores(evs, hw)
        if len(per_core) == 1:
            reports.append(next(iter(per_core.values())))
            continue
        slow = max(per_core.values(), key=lambda r: r.modeled_us)
        t = slow.modeled_us + _lnc_launch_us()
        reports.append(dataclasses.replace(slow, modeled_us=t, fraction_of_roofline=(
            slow.roofline_us / t if t > 0 else 0.0)))
    return combine(reports)


def _launch_cores(events: list, hw: HardwareConstants) -> dict:
    """``{core: CostReport}`` of one launch's events, by their ``core`` attr (none: core 0)."""
    cores: dict = {0: []} if not events else {}
    for ev in events:
        cores.setdefault(int(_attr(ev, "core", 0) or 0), []).append(ev)
    return {c: _estimate_launch(e, hw) for c, e in sorted(cores.items())}


def _lnc_launch_us() -> float:
    """:data:`API` ``lnc_launch_ns`` in us: the overhead of a launch on more than one core."""
    return API.lnc_launch_ns / 1e3


def _estimate_launch(events: Iterable[Any], hw: HardwareConstants) -> CostReport:
    """:func:`estimate` of the events of one launch."""
    busy_ns = dict.fromkeys(ENGINES[:-1], 0.0)
    counts = dict.fromkeys(ENGINES, 0)
    dma_engine_ns = np.zeros(hw.dma_engines)
    latency_sum = first_lat = last_lat = 0.0
    hbm_bytes = dma_bytes = flops = n_desc = 0
    compute_floor_ns = stall_ns = 0.0
    stall_by_engine = {"vector": 0.0, "scalar": 0.0}
    rotation = 0
    done_at: dict = {}            # seq -> (engine, time its result is written) of VectorE/ScalarE ops
    sync_ns = 0.0
    port_ns = dict.fromkeys(PORTS, 0.0)
    for ev in events:
        engine = getattr(ev, "engine", None)
        if engine == "sync" and getattr(ev, "op", "") == "loop_iteration":
            # nl.fori_loop / while_loop iteration barrier (serial)
            sync_ns += API.fori_iteration_ns
            continue
        if engine not in ENGINES:
            raise ValueError(f"event engine must be one of {ENGINES}; got {engine!r}")
        if engine != "dma":
            engine = assigned_engine(ev, hw)
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
        clock = hw.clock_ghz(engine)
        start = busy_ns[engine]
        if engine in ("vector", "scalar"):
            # in-order engine: an instruction reading the result of one on the same engine waits
            # until that result is written (dependent-issue latency)
            for d in _attr(ev, "deps", ()) or ():
                prev = done_at.get(d)
                if prev is not None and prev[0] == engine:
                    start = max(start, prev[1] + hw.dependent_issue_latency_cycles / clock)
            stall_ns += start - busy_ns[engine]
            stall_by_engine[engine] += start - busy_ns[engine]
        dur = compute_cycles(ev, hw, engine) / clock
        busy_ns[engine] = start + dur
        if engine != "tensor":
            for port in instruction_ports(ev, engine, hw):
                port_ns[port] += dur
        if engine in ("vector", "scalar"):
            done_at[getattr(ev, "seq", -1)] = (engine, busy_ns[engine])
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
    port_us = {p: port_ns[p] / 1e3 for p in PORTS}
    # the busiest resource: an engine, or a shared port (its engines' instructions that hold
    # it, one after another); everything outside it overlaps with beta's inefficiency
    lower = max(max(per_engine_us.values()), max(port_us.values()))
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
        dependency_stall_us=stall_ns / 1e3,
        stall_by_engine_us=MappingProxyType({e: v / 1e3 for e, v in stall_by_engine.items()}),
        instructions=MappingProxyType(counts), sync_us=sync_ns / 1e3,
        port_us=MappingProxyType(port_us), compute_floor_us=compute_floor_ns / 1e3)


def estimate_cores(trace_or_events: Any, target: Any = "trn2") -> LaunchReport:
    """Model each logical core of a trace separately (events carry their core in ``attrs``
    ``core``; events without one belong to core 0), launch by launch: a launch takes as long as
    its slower core (plus :data:`API` ``lnc_launch_ns`` when it runs on more than one core) and
    launches run one after the other,
    so ``launch_us`` is the sum over launches; ``per_core`` holds each core's reports combined
    over the launches (:func:`combine`), ``slowest_core`` the core with the largest of those."""
    hw = get_constants(target)
    events = list(getattr(trace_or_events, "events", trace_or_events))
    launch_us = 0.0
    per_launch: dict = {}
    for evs in split_launches(events) or [[]]:
        reps = _launch_cores(evs, hw)
        launch_us += max(r.modeled_us for r in reps.values()) + (
            _lnc_launch_us() if len(reps) > 1 else 0.0)
        for c, r in reps.items():
            per_launch.setdefault(c, []).append(r)
    per = {c: combine(rs) for c, rs in sorted(per_launch.items())}
    slow = max(per, key=lambda c: per[c].modeled_us)
    return LaunchReport(MappingProxyType(per), launch_us, slow)
