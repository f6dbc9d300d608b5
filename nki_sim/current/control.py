"""Loops and conditionals of the current API (reference §4.4).

Python ``for`` / ``while`` / ``if`` run eagerly (they are unrolled by AWS's specialisation too).
``nl.affine_range`` / ``sequential_range`` / ``static_range`` are aliases of ``range``.  Runtime
control flow: ``nl.fori_loop(lower, upper, body, step=1)`` calls ``body(i)`` once per iteration
with a runtime induction value (a ``VirtualRegister`` on NKI 0.6, an ``NkiScalar`` from 0.7; a
Python int with ``unroll=True``, 0.8); ``nl.while_loop(cond_reg, body)`` repeats while the
register returned by ``body`` is non-zero; ``nl.if_else(cond, then_fn, else_fn)`` (0.8).  Every
fori_loop iteration records a ``sync`` / ``loop_iteration`` trace event (its scheduling barrier).
"""

from __future__ import annotations

import contextlib
import threading
import warnings

from .. import trace
from . import version
from .checks import require_kernel
from .scalars import NkiScalar, VirtualRegister, value_of


class _Local(threading.local):
    def __init__(self):
        self.fori_depth = 0
        self.no_reorder = 0


_local = _Local()


def in_fori_loop() -> bool:
    return _local.fori_depth > 0


def affine_range(*args):
    return range(*args)


sequential_range = static_range = affine_range


def _induction(i):
    return VirtualRegister(i) if not version.has((0, 7)) else NkiScalar(i)


def _iteration_event(kind, i):
    if trace.active():
        trace.emit("sync", "loop_iteration", attrs={"loop": kind, "iteration": i})


def fori_loop(lower, upper, body_fun, step=1, unroll=False, name=""):
    """``for i in range(lower, upper, step): body_fun(i)`` with a runtime induction value."""
    require_kernel("nl.fori_loop")
    if unroll:
        version.require((0, 8), "nl.fori_loop(unroll=True)")
    if _local.no_reorder:
        raise SyntaxError("nl.fori_loop is not allowed inside nl.no_reorder()")
    if isinstance(step, NkiScalar) or not isinstance(step, int) or step <= 0:
        raise AssertionError(f"nl.fori_loop: step must be a positive compile-time int; got {step!r}")
    lo, hi = value_of(lower), value_of(upper)
    for b in (lower, upper):
        if isinstance(b, NkiScalar) and b.dtype == "int64":
            raise TypeError("nl.fori_loop: int64 scalars cannot bound a loop")
    _local.fori_depth += 1
    try:
        for i in range(lo, hi, step):
            if not unroll:
                _iteration_event("fori_loop", i)
            r = body_fun(i if unroll else _induction(i))
            if r is not None:
                raise SyntaxError("nl.fori_loop: the body must not return a value (no loop-carried "
                                  "values; keep cross-iteration state in SBUF / HBM)")
    finally:
        _local.fori_depth -= 1


def while_loop(cond, body_fun, name=""):
    """Repeat ``body_fun()`` while the condition register / scalar is non-zero; the body returns
    the next condition."""
    require_kernel("nl.while_loop")
    c = value_of(cond)
    _local.fori_depth += 1
    n = 0
    try:
        while c:
            _iteration_event("while_loop", n)
            nxt = body_fun()
            if nxt is None:
                raise SyntaxError("nl.while_loop: the body must return the next condition register")
            c = value_of(nxt)
            n += 1
    finally:
        _local.fori_depth -= 1


def if_else(cond, then_fn, else_fn=None):
    """Runtime conditional (NKI 0.8): a Python bool resolves at trace time, a scalar at run time."""
    version.require((0, 8), "nl.if_else")
    require_kernel("nl.if_else")
    c = cond if isinstance(cond, bool) else value_of(cond)
    if c:
        return then_fn()
    if else_fn is not None:
        return else_fn()
    return None


def dynamic_range(start, stop=None, step=1):
    """Register-bounded loop (deprecated in 0.6, removed by the 0.7 tracer)."""
    if version.has((0, 7)):
        from ..errors import NotEmulatedError
        raise NotEmulatedError("nl.dynamic_range was removed in NKI 0.7; use nl.fori_loop")
    warnings.warn("nl.dynamic_range is deprecated (NKI 0.6); use nl.fori_loop", DeprecationWarning,
                  stacklevel=2)
    if isinstance(step, NkiScalar):
        raise AssertionError("nl.dynamic_range: step must be a compile-time int, not a register")
    if stop is None:
        start, stop = 0, start
    lo, hi = value_of(start), value_of(stop)
    for i in range(lo, hi, step):
        yield VirtualRegister(i)


@contextlib.contextmanager
def no_reorder():
    _local.no_reorder += 1
    try:
        yield
    finally:
        _local.no_reorder -= 1
