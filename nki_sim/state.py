"""Mutable runtime state of the (single-threaded) simulator.

One ``KernelContext`` is active while a top-level kernel runs (``state.kernel``); it holds
the SPMD coordinates, the stack of enclosing NKI loops and the shared-HBM allocations that
all programs of a grid launch share.  ``epoch`` is a global counter advanced at the start
of every ``affine_range`` iteration; the dependency checker compares per-element write /
read epochs against the [loop start, iteration start) window of each enclosing affine loop.
"""

from __future__ import annotations

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
    shared_allocs: list = field(default_factory=list)   # shared_hbm allocations, in order
    shared_cursor: int = 0
    params: dict = field(default_factory=dict)           # alloc id -> parameter name
    target: object = None
    live: object = None                                  # memory.Live of the running program
    unwound: tuple = None     # (kind, value) of the loops closed early last (error context)
    code: object = None       # code object of the top-level kernel function


class _State:
    def __init__(self):
        self.kernel: KernelContext | None = None
        self.epoch: int = 0
        self.traces: list = []

    def loop_indices(self) -> tuple:
        k = self.kernel
        return tuple(f.value for f in k.loops) if k else ()

    def affine_frames(self):
        k = self.kernel
        if not k:
            return ()
        return [f for f in k.loops if f.kind == "affine"]


state = _State()
