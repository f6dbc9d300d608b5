"""Runtime scalars: ``NkiScalar`` (NKI 0.7+, ``nisa.scalar_load``) and ``VirtualRegister``
(registers, NKI <= 0.7; deprecated in 0.8).

The simulator is eager, so a scalar holds its value; arithmetic is fixed-width (int32 wraps,
int64 allows only ``+ - *``) and comparisons give 0 / 1 scalars.  Using one in Python control
flow (``if``, ``while``, ``int()``, ``range()``) raises ``TypeError`` as under AWS's tracer; runtime
control flow goes through ``nl.fori_loop`` / ``nl.while_loop`` / ``nl.if_else``.
"""

from __future__ import annotations

import operator


def _wrap(v: int, bits: int) -> int:
    m = 1 << bits
    v %= m
    return v - m if v >= m >> 1 else v


class NkiScalar:
    """A runtime integer (int32 unless loaded from an int64 tile)."""

    __slots__ = ("value", "dtype")
    _kind = "NkiScalar"

    def __init__(self, value, dtype="int32"):
        self.dtype = dtype
        self.value = _wrap(int(value), 64 if dtype == "int64" else 32)

    def _bin(self, other, fn, name, reverse=False):
        if isinstance(other, (NkiScalar, VirtualRegister)):
            o, dt = other.value, ("int64" if "int64" in (self.dtype, other.dtype) else "int32")
        elif isinstance(other, int) and not isinstance(other, bool):
            o, dt = other, self.dtype
        else:
            return NotImplemented
        if dt == "int64" and name not in ("add", "sub", "mul"):
            raise TypeError(f"int64 {self._kind} supports only + - *; got {name}")
        a, b = (o, self.value) if reverse else (self.value, o)
        return type(self)(fn(a, b), dt)

    def __add__(self, o): return self._bin(o, operator.add, "add")
    def __radd__(self, o): return self._bin(o, operator.add, "add", True)
    def __sub__(self, o): return self._bin(o, operator.sub, "sub")
    def __rsub__(self, o): return self._bin(o, operator.sub, "sub", True)
    def __mul__(self, o): return self._bin(o, operator.mul, "mul")
    def __rmul__(self, o): return self._bin(o, operator.mul, "mul", True)
    def __floordiv__(self, o): return self._bin(o, operator.floordiv, "floordiv")
    def __mod__(self, o): return self._bin(o, operator.mod, "mod")
    def __lshift__(self, o): return self._bin(o, operator.lshift, "lshift")
    def __rshift__(self, o): return self._bin(o, operator.rshift, "rshift")
    def __and__(self, o): return self._bin(o, operator.and_, "and")
    def __or__(self, o): return self._bin(o, operator.or_, "or")

    def _cmp(self, o, fn):
        r = self._bin(o, lambda a, b: int(fn(a, b)), "cmp")
        return r

    def __lt__(self, o): return self._cmp(o, operator.lt)
    def __le__(self, o): return self._cmp(o, operator.le)
    def __gt__(self, o): return self._cmp(o, operator.gt)
    def __ge__(self, o): return self._cmp(o, operator.ge)
    def __eq__(self, o): return self._cmp(o, operator.eq)
    def __ne__(self, o): return self._cmp(o, operator.ne)
    __hash__ = object.__hash__

    def _trace_only(self, *a):
        raise TypeError(f"a runtime {self._kind} cannot be used in Python control flow, int() or "
                        "range(); use nl.fori_loop / nl.while_loop / nl.if_else or .ap(scalar_offset=)")

    __bool__ = __int__ = __index__ = _trace_only

    def __repr__(self):
        return f"<{self._kind} {self.dtype} = {self.value}>"


class VirtualRegister(NkiScalar):
    """``nisa.register_alloc`` result (a 32-bit engine-sequencer register)."""

    __slots__ = ()
    _kind = "VirtualRegister"

    def __init__(self, value=0, dtype="int32"):
        super().__init__(value, "int32")


def value_of(x) -> int:
    """The integer value of a Python int, NkiScalar or VirtualRegister."""
    if isinstance(x, NkiScalar):
        return x.value
    if isinstance(x, bool) or not isinstance(x, int):
        import numpy as np
        if isinstance(x, np.integer):
            return int(x)
        raise TypeError(f"expected an int or a runtime scalar; got {type(x).__name__}")
    return x
