"""NKI loop iterators: ``affine_range``, ``sequential_range``, ``static_range``.

The simulator is eager: every loop runs in program order with plain int loop variables
(what the NKI 0.3+ simulator does).  The loops push a frame on the kernel's loop stack so
events carry ``loop_indices`` and the dependency checker knows each ``affine_range``
iteration's epoch window (see :mod:`nki_sim.access`).
"""

from __future__ import annotations

import sys

from .state import LoopFrame, state


class _Loop:
    __slots__ = ("r", "kind", "src")

    def __init__(self, args, kind, depth=2):
        if not 1 <= len(args) <= 3:
            raise TypeError(f"nl.{kind}_range takes 1 to 3 integer arguments; got {len(args)}")
        try:
            self.r = range(*[int(a) for a in args])
        except TypeError:
            raise TypeError(f"nl.{kind}_range arguments must be Python ints (compile-time); "
                            f"got {args!r}") from None
        self.kind = kind
        f = sys._getframe(depth)
        self.src = (f.f_code.co_filename, f.f_lineno)

    def __len__(self):
        return len(self.r)

    def __iter__(self):
        k = state.kernel
        if k is None:           # used outside a kernel: behave like range
            yield from self.r
            return
        state.epoch += 1
        frame = LoopFrame(kind=self.kind, loop_start=state.epoch, iter_start=state.epoch,
                          src=self.src)
        k.loops.append(frame)
        affine = self.kind == "affine"
        try:
            for v in self.r:
                frame.value = v
                if affine:
                    state.epoch += 1
                    frame.iter_start = state.epoch
                    frame.starts.append(state.epoch)
                    frame.values.append(v)
                k.unwound = None
                yield v
        except GeneratorExit:         # closed early (break, or an exception unwinding the kernel)
            snap = tuple((f.kind, f.value) for f in k.loops)
            if k.unwound is None or len(snap) > len(k.unwound):
                k.unwound = snap
            raise
        finally:
            frame.alive = False
            if k.loops and k.loops[-1] is frame:
                k.loops.pop()
            elif frame in k.loops:
                k.loops.remove(frame)
            state.epoch += 1


def affine_range(*args, **kwargs):
    """Parallel iterations with no loop-carried dependency (checked), except PSUM ``+=`` matmul."""
    return _Loop(args, "affine")


def sequential_range(*args, **kwargs):
    """Iterations in order; loop-carried dependencies allowed."""
    return _Loop(args, "sequential")


def static_range(*args, **kwargs):
    """Fully unrolled at trace time on hardware; executed in order here."""
    return _Loop(args, "static")
