"""NKI loop iterators: ``affine_range``, ``sequential_range``, ``static_range``.

The simulator is eager: every loop runs in program order with plain int loop variables
(what the NKI 0.3+ simulator does).  The loops push a frame on the kernel's loop stack so
events carry ``loop_indices`` and the dependency checker knows each ``affine_range``
iteration's epoch window (see :mod:`nki_sim.access`).
"""

from __future__ import annotations

import sys
import warnings

from . import errors as E
from .config import config
from .deps import loop_var
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
                          src=self.src, n=len(self.r))
        k.loops.append(frame)
        affine = self.kind == "affine"
        if affine:
            k.affine.append(frame)
        traced = config.traced_loops != "off"
        if traced:
            name = loop_var(frame)
        wrap = traced and self.kind != "static"
        s, starts, values = state, frame.starts, frame.values
        try:
            for v in self.r:
                frame.value = v
                if affine:
                    e = s.epoch + 1
                    s.epoch = e
                    frame.iter_start = e
                    starts.append(e)
                    values.append(v)
                k.unwound = None
                yield LoopVar(v, name) if wrap else v
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
            if affine:
                if k.affine and k.affine[-1] is frame:
                    k.affine.pop()
                elif frame in k.affine:
                    k.affine.remove(frame)
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


# ---------------------------------------------------------------------------- traced loop vars
class LoopPredicate:
    """A comparison involving an affine/sequential loop variable (``configure(traced_loops=...)``).

    Legacy NKI traces affine / sequential loop bodies once, so a Python ``if`` on such a
    comparison is not evaluated per iteration (undefined behaviour in NKI 0.1, "Changes in NKI
    0.2.0").  ``bool()`` of it warns or raises; as ``mask=`` it is fine.
    """

    __slots__ = ("value", "text")

    def __init__(self, value: bool, text: str):
        self.value, self.text = bool(value), text

    def __bool__(self):
        _traced_use(f"Python control flow on '{self.text}'")
        return self.value

    def __and__(self, o):
        return LoopPredicate(self.value and bool(getattr(o, "value", o)), f"{self.text} & ...") \
            if not hasattr(o, "v") else NotImplemented

    __rand__ = __and__

    def __repr__(self):
        return f"LoopPredicate({self.text} -> {self.value})"


def _traced_use(what: str):
    msg = (f"{what}: legacy NKI traces nl.affine_range / nl.sequential_range bodies once, so Python "
           "decisions on loop variables are not made per iteration; use nl.static_range for Python-"
           "level control flow, or mask= / nl.where for per-iteration predicates")
    if config.traced_loops == "error":
        raise E.NkiCompileError(msg, code="err_control_flow_condition_depending_on_loop_variable")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _lv(op):
    def f(self, other):
        r = getattr(int, op)(self, other)
        return LoopVar(r, self.name) if isinstance(r, int) and not isinstance(r, bool) else r
    return f


def _cmp(op, sym):
    def f(self, other):
        r = getattr(int, op)(self, other)
        if r is NotImplemented:
            return r
        return LoopPredicate(r, f"{self.name} {sym} {other}")
    return f


class LoopVar(int):
    """Loop variable of an affine / sequential loop under ``configure(traced_loops=...)``."""

    def __new__(cls, v, name="i"):
        obj = int.__new__(cls, v)
        obj.name = name
        return obj

    __add__, __radd__, __sub__, __rsub__ = _lv("__add__"), _lv("__radd__"), _lv("__sub__"), _lv("__rsub__")
    __mul__, __rmul__, __floordiv__, __mod__ = _lv("__mul__"), _lv("__rmul__"), _lv("__floordiv__"), _lv("__mod__")
    __lt__, __le__, __gt__, __ge__ = _cmp("__lt__", "<"), _cmp("__le__", "<="), _cmp("__gt__", ">"), _cmp("__ge__", ">=")
    __eq__, __ne__ = _cmp("__eq__", "=="), _cmp("__ne__", "!=")
    __hash__ = int.__hash__

    def __bool__(self):
        _traced_use(f"truth value of loop variable {self.name}")
        return int(self) != 0
