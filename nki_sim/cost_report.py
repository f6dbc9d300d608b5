"""The reports of the cost model (``nki_sim/cost.py``): :class:`CostReport` for one NeuronCore,
:func:`combine` for launches run one after the other, :class:`LaunchReport` for a logical core's
physical cores. All figures MODELED."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from .cost_constants import get_constants


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
    dependency_stall_us: float = 0.0     # VectorE / ScalarE waits for a result of the same engine
    stall_by_engine_us: Mapping[str, float] = field(default_factory=dict)   # the same, per engine
    instructions: Mapping[str, int] = field(default_factory=dict)
    sync_us: float = 0.0                 # fori_loop iteration barriers (added serially)
    port_us: Mapping[str, float] = field(default_factory=dict)   # shared ports (PORTS) busy
    launches: int = 1                    # kernel launches modeled (run one after the other)
    compute_floor_us: float = 0.0        # FLOPs / TensorE peak (fp32 matmuls at their rate)
    method: str = ("modeled_us = busiest resource (engine or shared port) + overlap_inefficiency"
                   " * engine time outside it + latency of the first and the last DMA instruction;"
                   " launches one after the other (summed)")

    @property
    def bottleneck(self) -> str:
        """Name of the busiest resource: an engine, or a shared port (:data:`PORTS`, e.g.
        ``"vector+gpsimd"``) when its engines' turns on it take longer than any engine (over
        several launches: the resource with the largest total)."""
        name = max(self.per_engine_us, key=self.per_engine_us.get)
        port = max(self.port_us, key=self.port_us.get, default=None)
        if port is not None and self.port_us[port] > self.per_engine_us[name]:
            return port
        return name

    def as_dict(self) -> dict:
        """Plain dict (JSON-serialisable)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["per_engine_us"] = dict(self.per_engine_us)
        d["instructions"] = dict(self.instructions)
        d["stall_by_engine_us"] = dict(self.stall_by_engine_us)
        d["port_us"] = dict(self.port_us)
        d["bottleneck"] = self.bottleneck
        return d


def combine(reports: Sequence[CostReport]) -> CostReport:
    """One report for launches run one after the other: times, counts, bytes and FLOPs add up
    (``modeled_us`` is the sum of the launches' modeled times; ``lower_bound_us`` the sum of
    their busiest resources), the roofline is that of the total bytes and FLOPs, ``launches``
    counts them."""
    if not reports:
        raise ValueError("reports must hold at least one CostReport; got none")
    if len(reports) == 1:
        return reports[0]
    hw = get_constants(reports[0].target)

    def total(name):
        return sum(getattr(r, name) for r in reports)

    def per_key(name):
        keys = list(getattr(reports[0], name))
        return MappingProxyType({k: sum(getattr(r, name).get(k, 0) for r in reports)
                                 for k in keys})

    hbm_bytes, flops = total("hbm_bytes"), total("flops")
    compute_floor = total("compute_floor_us")
    roofline = max(hbm_bytes / hw.hbm_bw_bytes_per_ns / 1e3, compute_floor)
    modeled = total("modeled_us")
    return dataclasses.replace(
        reports[0], per_engine_us=per_key("per_engine_us"), lower_bound_us=total("lower_bound_us"),
        upper_bound_us=total("upper_bound_us"), modeled_us=modeled, hbm_bytes=hbm_bytes,
        flops=flops, roofline_us=roofline,
        fraction_of_roofline=roofline / modeled if modeled > 0 else 0.0,
        dma_instructions=total("dma_instructions"), dma_descriptors=total("dma_descriptors"),
        dma_bytes=total("dma_bytes"), dma_engine_max_us=total("dma_engine_max_us"),
        dma_queue_us=total("dma_queue_us"), dma_hbm_cap_us=total("dma_hbm_cap_us"),
        exposed_latency_us=total("exposed_latency_us"),
        dependency_stall_us=total("dependency_stall_us"),
        stall_by_engine_us=per_key("stall_by_engine_us"), instructions=per_key("instructions"),
        sync_us=total("sync_us"), port_us=per_key("port_us"), launches=total("launches"),
        compute_floor_us=compute_floor)


@dataclass(frozen=True)
class LaunchReport:
    """Logical-core launches (LNC=2): one CostReport per core (combined over the trace's
    launches); a launch takes as long as its slower core (plus :data:`API` ``lnc_launch_ns``),
    and ``launch_us`` sums the launches.  All figures MODELED."""

    per_core: Mapping[int, CostReport]
    launch_us: float
    slowest_core: int
