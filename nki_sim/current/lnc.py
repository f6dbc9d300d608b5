"""Two logical cores (LNC=2): one thread per core, shared HBM, and the ``nki.lnc`` collectives.

Each core runs the kernel in its own thread with its own simulator state (SBUF / PSUM, engine
accumulators, trace); ``nl.shared_hbm`` allocations are shared by allocation order and kernel
arguments are one HBM.  ``sendrecv`` (``nki.lnc`` from NKI 0.8, ``nki.isa`` before, with
``pipe_id``) exchanges a tile with the peer core; ``core_barrier`` waits for it.  After the launch
each core's events are appended to the caller's traces, core 0 first (events carry their core as
``program_id``), so traces are deterministic; the cost model reports per core
(:func:`nki_sim.cost` per-core helpers).
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from ..access import Access
from ..engines.common import operand, write_dst
from ..blas import single_threaded
from ..memory import Live
from ..state import KernelContext, state
from ..trace import Trace
from . import version
from .checks import check_capacity, fail, require_kernel, tile

_BARRIER_TIMEOUT = 120.0


class _Launch:
    """What the cores of one launch share."""

    def __init__(self, lnc):
        self.lnc = lnc
        self.barrier = threading.Barrier(lnc, timeout=_BARRIER_TIMEOUT)
        self.mailbox = [None] * lnc
        self.lock = threading.Lock()


def _ctx_launch():
    k = state.kernel
    return getattr(k, "lnc_launch", None)


def run_cores(func, bound, ctx_args: dict, lnc: int):
    """Run ``func`` on ``lnc`` logical cores in threads; returns core 0's return value."""
    launch = _Launch(lnc)
    shared: list = []
    traces = list(state.traces)
    overrides = dict(state.overrides)
    targets = list(state.targets)
    ver = version.current()
    from . import dtypes as T
    precise = T.precise()
    results, errors, core_traces = [None] * lnc, [None] * lnc, [None] * lnc

    def main(core):
        state.overrides.update(overrides)
        T.set_precise(precise)
        state.targets[:] = targets
        ctx = KernelContext(**ctx_args)
        ctx.program_id = (core,)
        ctx.lnc_core = core
        ctx.shared_allocs = shared
        ctx.live = Live()
        ctx.lnc_launch = launch
        tr = Trace() if traces else None
        if tr is not None:
            state.traces.append(tr)
        state.kernel = ctx
        try:
            with version.use_nki_version(ver), single_threaded(), np.errstate(all="ignore"):
                results[core] = func(*bound.args, **bound.kwargs)
                check_capacity(ctx.live, ctx.target)
        except BaseException as e:           # noqa: BLE001 (re-raised in the caller)
            from ..runtime import add_context_note
            add_context_note(e, ctx)
            errors[core] = e
            launch.barrier.abort()
        finally:
            state.kernel = None
            core_traces[core] = tr

    threads = [threading.Thread(target=main, args=(c,), name=f"nki-lnc-core{c}") for c in range(lnc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if real or any(errors):
        raise (real or [e for e in errors if e is not None])[0]
    for tr in traces:
        for ct in core_traces:
            for ev in ct.events:
                tr.events.append(dataclasses.replace(ev, seq=len(tr.events), launch=tr.launch))
            for b, v in ct.peak_bytes_per_partition.items():
                tr.peak_bytes_per_partition[b] = max(tr.peak_bytes_per_partition[b], v)
            for name, per in ct.targets.items():
                mine = tr.targets.setdefault(name, {"sbuf": 0, "psum": 0})
                for b, v in per.items():
                    mine[b] = max(mine[b], v)
    return results[0]


def shared_lock():
    launch = _ctx_launch()
    return launch.lock if launch is not None else None


def _peer(rank, name):
    k = state.kernel
    n = k.grid[0] if k.grid else 1
    r = int(rank)
    if not 0 <= r < n or r == k.program_id[0]:
        fail(f"sendrecv: {name}={rank} must be the other logical core (0..{n - 1}, not "
             f"{k.program_id[0]})")
    return r


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id=None, dma_engine=None, name=""):
    """Send ``src`` to core ``send_to_rank`` and receive core ``recv_from_rank``'s ``src`` into
    ``dst`` (same element count)."""
    if pipe_id is not None and version.has((0, 8)):
        raise TypeError("nki.lnc.sendrecv: pipe_id was dropped in NKI 0.8")
    require_kernel("sendrecv")
    src, dst = tile(src, "sendrecv", "src"), tile(dst, "sendrecv", "dst")
    launch = _ctx_launch()
    if launch is None:
        fail("sendrecv needs a launch on 2 logical cores (kernel[2] / NEURON_LOGICAL_NC_CONFIG=2)")
    _peer(send_to_rank, "send_to_rank")
    peer = _peer(recv_from_rank, "recv_from_rank")
    if src.size != dst.size:
        fail(f"sendrecv: src ({src.size} elements) and dst ({dst.size}) must have the same count")
    me = state.kernel.program_id[0]
    s = src.core()
    o = operand(s, "src", "sendrecv", True)             # garbage rows travel as garbage
    launch.mailbox[me] = (np.array(o.v), o)
    launch.barrier.wait()
    d = dst.core()
    vals, po = launch.mailbox[peer]
    dacc = write_dst(d, vals.reshape(d.shape), "sendrecv", inputs=(po,))
    launch.barrier.wait()
    sacc = Access(s)
    from ..engines.dma import emit_dma
    emit_dma("sendrecv", s, d, sacc, dacc.count(), name=name, attrs={"peer": peer})


def core_barrier(*args, name=""):
    require_kernel("core_barrier")
    launch = _ctx_launch()
    if launch is not None:
        launch.barrier.wait()
