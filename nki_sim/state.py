"""Mutable runtime state of the simulator, one instance per thread.

``state`` is a ``threading.local``: every thread has its own running kernel, epoch counter,
active traces, ``use_target`` stack and ``configure`` overrides, so kernels simulated in
different threads at the same time never see each other (nki_sim/README.md, "Threads").

One ``KernelContext`` is active while a top-level kernel runs (``state.kernel``); it holds
the SPMD coordinates, the stack of enclosing NKI loops and the shared-HBM allocations that
all programs of a grid launch share.  ``epoch`` is a counter advanced at the start of every
``affine_range`` iteration; the dependency checker compares per-element write / read epochs
against the [loop start, iteration start) window of each enclosing affine loop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class LoopFrame:
    kind: str                 # "affine" | "sequential" | "static"
    value: int = 0
    loop_start: int = 0       # epoch when this loop instance started
    iter_start: int = 0       # epoch when the current iteration started
    src: tuple = ("", 0)      # (filename, line) of the `for` statement
    var: str = ""             # loop variable name (resolved lazily)
    starts: list = field(default_factory=list)   # iteration start epochs (affine loops)
    values: list = field(default_factory=list)   # loop values matching ``starts``
    alive: bool = True        # False once the loop has exited (scope check)
    n: int = 0                # trip count


@dataclass
class KernelContext:
    name: str
    grid: tuple = ()
    program_id: tuple = ()
    loops: list = field(default_factory=list)
    affine: list = field(default_factory=list)          # the affine_range frames of ``loops``
    shared_allocs: list = field(default_factory=list)   # shared_hbm allocations, in order
    shared_cursor: int = 0
    params: dict = field(default_factory=dict)           # alloc id -> parameter name
    target: object = None
    live: object = None                                  # memory.Live of the running program
    unwound: tuple = None     # (kind, value) of the loops closed early last (error context)
    code: object = None       # code object of the top-level kernel function
    accumulators: dict = None  # engine accumulator registers (nisa.activation reduce_cmd)
    acc_warned: set = None     # source locations already warned about accumulator chains
    tensor_type: type = None   # the front end's tensor class (nki_sim.tensor.Tensor subclass)


class _State(threading.local):
    """Per-thread state (``threading.local``: ``__init__`` runs once in every thread)."""

    def __init__(self):
        self.kernel: KernelContext | None = None
        self.epoch: int = 0
        self.traces: list = []        # active nki_sim.tracing() Trace objects of this thread
        self.targets: list = []       # use_target stack of this thread
        self.overrides: dict = {}     # configure() overrides of this thread (name -> value)
        self.implied: list = []       # poison masks implied by the current instruction's inputs

    def loop_indices(self) -> tuple:
        k = self.kernel
        return tuple([f.value for f in k.loops]) if k else ()

    def affine_frames(self):
        k = self.kernel
        if not k:
            return ()
        return [f for f in k.loops if f.kind == "affine"]


state = _State()
