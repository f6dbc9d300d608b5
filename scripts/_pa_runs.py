"""Run one paged-attention kernel on nki_sim under tracing and turn the trace into a result row.

Used by scripts/bench_paged_attention.py. Kernels:

    scheduled  ``host.paged_attention(kernel="scheduled")`` (the product default): host schedule
               of block-sparse (Q group, KV tile) items, masks from per-row bounds in-kernel
    dense      ``host.paged_attention(kernel="dense")``: every 128-row Q tile against every
               context tile with a dense host-built bool mask (vLLM interface); GQA packing as
               the host chooses it ("auto", recorded in the row)
    per_block  ``nki_kernels.baselines.per_block_paged_attention`` (the dense kernel with one
               KV DMA per cache block, unpacked), inputs from :func:`kernel_inputs`

"Mask bytes" are the bytes of the runtime mask input the host builds for one launch set:
dense / per_block: the (Qpad, context_kv_len + Qpad) bool mask; scheduled: the float32
arrays of every class and phase (``PhaseArrays.meta_f``: reset flags and the per-row bounds
c, r of masked items; ``PhaseArrays.bounds``: the decode layout's bounds; ``host.scheduled.schedule``),
taken from the schedules the host really built for the launches (:func:`captured_schedules`). The scheduled kernel's int32 gather/row indices
(``meta_i``) are reported separately as ``index_bytes`` (dense: the int32 active block table).

Every time here is MODELED by ``nki_sim.cost`` (docs/cost-model.md), except ``sim_seconds``:
the wall time of the simulated call, host preparation included.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import defaultdict

import numpy as np

from _pa_workloads import Workload, useful_roofline_us, useful_work
from nki_pa_cli.script_args import AUTO_API

KERNELS = ("scheduled", "dense", "per_block")
LARGE_TILE = 2048


def kernel_inputs(batch: dict, large_tile_size: int = LARGE_TILE):
    """The dense kernels' positional inputs (query, key, value, kv_cache, block_tables, mask),
    built with the host API as ``host.attention.paged_attention(kernel="dense",
    gqa_packing=False)`` does, plus T (real tokens)."""
    from host.dense.block_tables import active_block_table
    from host.dense.masks import build_attention_mask
    from host.dense.plan import make_plan

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


@contextlib.contextmanager
def captured_schedules():
    """Record every ``AttentionSchedule`` that ``host.plan_paged_attention`` builds inside the
    block (a read-only spy on its ``build_schedule``), so the metadata counted is exactly what
    the kernel launches received."""
    import host.step_plan as sp
    real, seen = sp.build_schedule, []

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    sp.build_schedule = spy
    try:
        yield seen
    finally:
        sp.build_schedule = real


def scheduled_metadata(schedules) -> dict:
    """Mask / index bytes and item counts of the schedules a scheduled run launched: mask bytes
    = every float array of every ``PhaseArrays`` (``meta_f``: reset flags and per-row bounds;
    ``bounds``: the decode layout's bounds), index bytes = the int32 ``meta_i`` arrays."""
    if not schedules:
        raise RuntimeError("no schedule captured: host.step_plan no longer calls build_schedule")
    phases = [(c, p) for s in schedules for c in s.classes for p in (c.partial, c.full)]
    floats = [getattr(p, f.name) for _, p in phases for f in dataclasses.fields(p)]
    return dict(
        mask_bytes=sum(a.nbytes for a in floats
                       if isinstance(a, np.ndarray) and a.dtype.kind == "f"),
        index_bytes=sum(p.meta_i.nbytes for _, p in phases),
        launches=sum(len(s.classes) for s in schedules),
        large_tile_size=sorted({int(s.large_tile_size) for s in schedules}),
        items={f"{c.kind}/{'partial' if p.masked else 'full'}": [p.real_items, p.items]
               for c, p in phases})


def dense_metadata(batch: dict, large_tile_size: int = LARGE_TILE, packing=None) -> dict:
    """Mask / block-table sizes of the dense kernel (packing None: as ``gqa_packing="auto"``)."""
    from host.dense.gqa_packing import choose_gqa_packing
    from host.dense.plan import make_plan
    H, hkv = batch["query"].shape[1], batch["kv_cache"].shape[2]
    B = batch["kv_cache"].shape[3]
    ql, cl = batch["query_lens"], batch["context_lens"]
    if packing is None:
        packing = bool(choose_gqa_packing(ql, H, hkv, context_lens=cl,
                                          large_tile_size=large_tile_size)) and H > hkv
    G = H // hkv if packing else 1
    plan = make_plan(np.asarray(ql) * G, cl, block_size=B, large_tile_size=large_tile_size)
    Q = plan.padded_queries
    return dict(mask_bytes=Q * (plan.context_kv_len + Q), index_bytes=4 * plan.num_active_blocks,
                gqa_packing=packing, padded_queries=Q)


def simulate(kernel: str, batch: dict, target: str, large_tile_size=None,
             api: str | None = None, lnc: int = 1):
    """Run ``kernel`` on ``batch`` for ``target`` -> (output (T, H, d), trace, wall seconds, meta).
    Scheduled and dense kernels: on ``api`` (None: the host's choice) with ``lnc`` physical
    cores; per_block (a legacy-only baseline) on the legacy API, one core.
    ``large_tile_size`` None: the host default for the scheduled kernel (``"auto"``; the
    resolved size is ``meta["large_tile_size"]``), LARGE_TILE for the dense kernels."""
    if large_tile_size is None:
        large_tile_size = "auto" if kernel == "scheduled" else LARGE_TILE
    import nki_sim

    import host
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kernel!r}")
    if kernel == "per_block":
        from nki_kernels.toolchain import nki
        from nki_kernels.baselines.per_block_paged_attention import per_block_paged_attention
        args, T = kernel_inputs(batch, large_tile_size)
        meta = dense_metadata(batch, large_tile_size, packing=False)
        hkv = batch["kv_cache"].shape[2]
        t0 = time.perf_counter()
        with nki_sim.use_target(target), nki_sim.tracing() as trace:
            out = nki.simulate_kernel(per_block_paged_attention[1, hkv], *args,
                                      LARGE_TILE_SZ=large_tile_size)
        sec = time.perf_counter() - t0
        return np.asarray(out)[0, :, :T, :].transpose(1, 0, 2), trace, sec, meta
    t0 = time.perf_counter()
    with nki_sim.use_target(target), nki_sim.tracing() as trace, captured_schedules() as seen:
        extra = dict(api=api, lnc=lnc)
        out = host.paged_attention(**batch, kernel=kernel, backend="sim", mixed_precision=True,
                                   large_tile_size=large_tile_size, **extra)
    sec = time.perf_counter() - t0
    meta = (scheduled_metadata(seen) if kernel == "scheduled"
            else dense_metadata(batch, large_tile_size))
    return np.asarray(out), trace, sec, meta


def make_row(w: Workload, block_size: int, target: str, kernel: str, trace, sim_s: float,
             meta: dict, geometry: dict | None = None, api: str | None = None,
             lnc: int = 1) -> dict:
    """One JSON row: modeled cost, useful work, efficiency and the work ratios. With ``lnc``
    physical cores the modeled time is the slower core's (``nki_sim.cost.estimate_cores``) and
    the useful roofline that of ``lnc`` cores (efficiency per physical core used); the row's
    target label is then ``<target>-lnc<lnc>``, and a scheduled row on another API than the
    target's default (``nki_pa_cli.script_args.AUTO_API``; trn2: legacy) ends in ``-<api>``,
    e.g. ``trn2-lnc2-legacy``. Per-engine and DMA times are the slower core's;
    bytes, FLOPs and instruction counts are of all cores."""
    from nki_sim import cost
    launch = cost.estimate_cores(trace, target)
    rep = cost.combine(list(launch.per_core.values()))     # bytes, FLOPs, counts of all cores
    work = useful_work(w, **(geometry or {}))
    roof = useful_roofline_us(work, target)
    roof_us = roof["us"] / lnc
    slow = launch.per_core[launch.slowest_core]      # per-engine figures: the slower core's
    label = target if lnc == 1 else f"{target}-lnc{lnc}"
    if kernel == "scheduled" and api is not None and api != AUTO_API.get(target):
        label += f"-{api}"
    return dict(
        workload=w.name, kind=w.kind, target=label,
        kernel=kernel, block_size=block_size, api=api, lnc=lnc,
        num_seqs=w.num_seqs, query_tokens=w.query_tokens, context_tokens=w.context_tokens,
        modeled_us=launch.launch_us, useful_roofline_us=roof_us, useful_bound=roof["bound"],
        efficiency=roof_us / launch.launch_us,
        per_core_us=[r.modeled_us for r in launch.per_core.values()],
        useful_bytes=work["bytes"], hbm_bytes=rep.hbm_bytes,
        bytes_ratio=rep.hbm_bytes / work["bytes"],
        useful_flops=work["flops"], flops=rep.flops,
        flops_ratio=rep.flops / work["flops"] if work["flops"] else float("nan"),
        mask_bytes=meta["mask_bytes"], index_bytes=meta["index_bytes"],
        dma_instructions=rep.dma_instructions,
        dma_indirect_instructions=sum(e.engine == "dma" and e.dma_kind == "indirect"
                                      for e in trace.events),
        per_engine_us=dict(slow.per_engine_us), port_us=dict(slow.port_us),
        bottleneck=slow.bottleneck,
        dma_engine_max_us=slow.dma_engine_max_us, dma_queue_us=slow.dma_queue_us,
        dma_hbm_cap_us=slow.dma_hbm_cap_us, exposed_latency_us=slow.exposed_latency_us,
        cost_model_fraction_of_roofline=rep.roofline_us / lnc / launch.launch_us,
        instructions=len(trace.events), sim_seconds=sim_s,
        meta={k: v for k, v in meta.items() if k not in ("mask_bytes", "index_bytes")})


def breakdown(trace, target: str, top: int = 6, ports: bool = False) -> dict:
    """Where the modeled time goes: {engine: {"us": total, "kinds": [(kind, us, count), ...]}}.

    Compute engines: ``nki_sim.cost.compute_cycles`` per event / clock of the engine the cost
    model charges (``assigned_engine``), grouped by (op, kernel source line), plus the
    dependent-issue waits. DMA: per instruction kind (op, direct/indirect, src->dst, line),
    the mean busy time of the 16 DMA engines (``dma_instruction_cost``) -- the DMA total of the
    cost model is max(busiest engine, sum(latency)/dma_inflight, HBM cap), reported beside it.
    GpSimd also carries the software-DGE descriptor generation of indirect DMAs. ``ports``: also
    ``"port <name>"`` for each shared port with busy time (``nki_sim.cost.instruction_ports``)."""
    from nki_sim import cost
    hw = cost.get_constants(target)
    acc = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    rotation = 0
    for ev in trace.events:
        loc = f"{ev.src_loc[0]}:{ev.src_loc[1]}"
        if ev.engine == "dma":
            c = cost.dma_instruction_cost(ev, hw, rotation)
            rotation = (rotation + c.engines_used) % hw.dma_engines
            kind = f"{ev.op} {ev.dma_kind} {ev.src_buffer}->{ev.dst_buffer} @{loc}"
            a = acc["dma"][kind]
            a[0] += float(c.engine_ns.sum()) / hw.dma_engines
            a[1] += 1
            if c.gpsimd_ns:
                g = acc["gpsimd"][f"swdge descriptors ({ev.op}) @{loc}"]
                g[0] += c.gpsimd_ns
                g[1] += 1
            continue
        eng = cost.assigned_engine(ev, hw)
        ns = cost.compute_cycles(ev, hw, eng) / hw.clock_ghz(eng)
        for res in (eng,) + (tuple(f"port {p}" for p in cost.instruction_ports(ev, eng, hw))
                             if ports else ()):
            a = acc[res][f"{ev.op} @{loc}"]
            a[0] += ns
            a[1] += 1
    rep = cost.estimate(trace, target)
    for eng, us in rep.stall_by_engine_us.items():
        if us:
            acc[eng]["waits for a result of the same engine"] = [us * 1e3, 0]
    out = {}
    for eng, total in rep.per_engine_us.items():
        kinds = sorted(acc[eng].items(), key=lambda kv: -kv[1][0])
        out[eng] = dict(us=total, kinds=[(k, ns / 1e3, n) for k, (ns, n) in kinds[:top]])
    for port, total in (rep.port_us.items() if ports else ()):
        if total:
            kinds = sorted(acc[f"port {port}"].items(), key=lambda kv: -kv[1][0])
            out[f"port {port}"] = dict(us=total, kinds=[(k, ns / 1e3, n) for k, (ns, n) in kinds[:top]])
    out["dma"].update(engine_max_us=rep.dma_engine_max_us, queue_us=rep.dma_queue_us,
                      hbm_cap_us=rep.dma_hbm_cap_us)
    out["modeled_us"] = rep.modeled_us
    return out
