"""Compile-time index objects: ``nl.arange``, ``nl.mgrid``, ``nl.ds``, ``par_dim`` and masks.

An :class:`IndexExpr` is an int64 NumPy array tagged as an NKI index (``nl.arange(128)[:, None]``);
affine arithmetic with ints (loop variables, program ids) and other index expressions keeps
the tag; comparisons give a :class:`MaskExpr` (bool array) that combines with ``&`` (and ``|``, ``~``).
Index and mask objects are not tiles: convert them with ``nisa.iota`` to compute on them.
"""

from __future__ import annotations

import operator

import numpy as np

from .errors import NkiCompileError


def _val(x):
    if isinstance(x, IndexExpr):
        return x.v
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("a bool cannot take part in an index expression")
    if isinstance(x, (int, np.integer)):
        return int(x)
    return NotImplemented


class IndexExpr:
    """Affine index expression over nl.arange / nl.mgrid grids (int64 values)."""

    __slots__ = ("v", "affine")
    __array_priority__ = 100
    __array_ufunc__ = None

    def __init__(self, v, affine: bool = True):
        self.v = np.asarray(v, dtype=np.int64)
        self.affine = affine    # False once %, // or index*index enter the expression

    shape = property(lambda self: self.v.shape)
    ndim = property(lambda self: self.v.ndim)

    def __getitem__(self, key):
        return IndexExpr(self.v[key], self.affine)

    def _bin(self, other, fn, reverse=False, keeps_affine=True):
        o = _val(other)
        if o is NotImplemented:
            return NotImplemented
        r = fn(o, self.v) if reverse else fn(self.v, o)
        affine = self.affine and keeps_affine and getattr(other, "affine", True)
        if fn is operator.mul and isinstance(other, IndexExpr):
            affine = False
        return IndexExpr(r, affine)

    def __add__(self, o): return self._bin(o, operator.add)
    def __radd__(self, o): return self._bin(o, operator.add, True)
    def __sub__(self, o): return self._bin(o, operator.sub)
    def __rsub__(self, o): return self._bin(o, operator.sub, True)
    def __mul__(self, o): return self._bin(o, operator.mul)
    def __rmul__(self, o): return self._bin(o, operator.mul, True)
    def __floordiv__(self, o): return self._bin(o, operator.floordiv, keeps_affine=False)
    def __rfloordiv__(self, o): return self._bin(o, operator.floordiv, True, keeps_affine=False)
    def __mod__(self, o): return self._bin(o, operator.mod, keeps_affine=False)
    def __rmod__(self, o): return self._bin(o, operator.mod, True, keeps_affine=False)
    def __neg__(self): return IndexExpr(-self.v, self.affine)
    def __pos__(self): return self

    def _cmp(self, other, fn):
        o = _val(other)
        if o is NotImplemented:
            return NotImplemented
        return MaskExpr(fn(self.v, o), affine=self.affine and getattr(other, "affine", True))

    def __lt__(self, o): return self._cmp(o, operator.lt)
    def __le__(self, o): return self._cmp(o, operator.le)
    def __gt__(self, o): return self._cmp(o, operator.gt)
    def __ge__(self, o): return self._cmp(o, operator.ge)
    def __eq__(self, o): return self._cmp(o, operator.eq)
    def __ne__(self, o): return self._cmp(o, operator.ne)
    __hash__ = object.__hash__

    def __bool__(self):
        raise ValueError("Cannot evaluate truth value of an index expression "
                         "(err_control_flow_condition_depending_on_arange)")

    def __index__(self):
        raise TypeError("an nl.arange / nl.mgrid index is not a Python int")

    def __repr__(self):
        return f"IndexExpr(shape={self.shape})"


class MaskExpr:
    """Predicate over an index grid (bool array); used as ``mask=`` / affine_select predicate."""

    __slots__ = ("v", "affine", "terms")
    __array_priority__ = 100
    __array_ufunc__ = None

    def __init__(self, v, affine: bool = True, terms: int = 1):
        self.v = np.asarray(v, dtype=bool)
        self.affine = affine    # every comparison side is affine in the indices
        self.terms = terms      # number of comparisons combined with & / |

    shape = property(lambda self: self.v.shape)

    @staticmethod
    def _m(x):
        if isinstance(x, MaskExpr):
            return x.v
        if hasattr(x, "text") and hasattr(x, "value"):        # loops.LoopPredicate
            return x.value
        if isinstance(x, (bool, np.bool_)):
            return bool(x)
        return NotImplemented

    def _combine(self, o, fn):
        m = self._m(o)
        if m is NotImplemented:
            return NotImplemented
        affine = self.affine and getattr(o, "affine", True)
        return MaskExpr(fn(self.v, m), affine, self.terms + getattr(o, "terms", 0))

    def __and__(self, o):
        return self._combine(o, operator.and_)

    __rand__ = __and__

    def __or__(self, o):
        return self._combine(o, operator.or_)

    __ror__ = __or__

    def __invert__(self):
        return MaskExpr(~self.v, self.affine, self.terms)

    def __bool__(self):
        raise ValueError(
            "Cannot evaluate truth value of a predicate on nl.arange / nl.mgrid indices: control flow "
            "cannot depend on index expressions (err_control_flow_condition_depending_on_arange); "
            "pass it as mask=, and combine masks with '&', not 'and'")

    def __repr__(self):
        return f"MaskExpr(shape={self.shape})"


def arange(*args) -> IndexExpr:
    """``nl.arange(stop)`` / ``nl.arange(start, stop)``: a 1-D index (lift with [:, None] / [None, :])."""
    if not 1 <= len(args) <= 3:
        raise TypeError(f"nl.arange takes 1 to 3 integer arguments; got {len(args)}")
    return IndexExpr(np.arange(*[int(a) for a in args], dtype=np.int64))


class MGrid(tuple):
    """Result of ``nl.mgrid[...]``: unpackable dense grids, also ``.p``, ``.x``, ``.y``."""

    @property
    def p(self): return self[0]

    @property
    def x(self): return self[1]

    @property
    def y(self): return self[2]


class _MGridMaker:
    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        grids = np.mgrid[key]
        if len(key) == 1:
            grids = grids[None] if grids.ndim == 1 else grids
        return MGrid(IndexExpr(g) for g in grids)


mgrid = _MGridMaker()


def ds(start, size) -> slice:
    """``nl.ds(start, size)``: the dynamic slice ``start:start+size``."""
    if type(start) is not int or type(size) is not int:
        start, size = int(start), int(size)
    if size <= 0:
        raise ValueError(f"nl.ds: size must be positive; got {size}")
    return slice(start, start + size)


class ParDim(int):
    """``nl.par_dim(n)``: marks the partition dimension of an on-chip tensor shape."""

    def __repr__(self):
        return f"par_dim({int(self)})"


def par_dim(n) -> ParDim:
    return ParDim(int(n))


def mask_array(mask, shape):
    """Evaluate a ``mask=`` argument to a bool array broadcast (left-aligned) to ``shape``, or None."""
    if mask is None:
        return None
    if hasattr(mask, "text") and hasattr(mask, "value"):     # loops.LoopPredicate: no warning
        mask = mask.value
    if isinstance(mask, (bool, np.bool_)):
        return None if mask else np.zeros(shape, dtype=bool)
    if isinstance(mask, MaskExpr):
        if not mask.affine:
            raise NkiCompileError(
                "mask= predicate uses a non-affine expression of the indices (%, // or a product of "
                "indices); masks must be affine in nl.arange / loop variables / program ids, combined "
                "with '&' (err_unsupported_expression_in_mask)", code="err_unsupported_expression_in_mask")
        m = mask.v
    else:
        raise TypeError("mask= must be a predicate on nl.arange / nl.mgrid indices "
                        f"(err_unsupported_expression_in_mask); got {type(mask).__name__}")
    return broadcast_left(m, shape)


def broadcast_left(a: np.ndarray, shape) -> np.ndarray:
    """Broadcast ``a`` to ``shape``; a lower-rank tile is padded with trailing 1s (legacy rule)."""
    shape = tuple(shape)
    if a.ndim < len(shape):
        a = a.reshape(a.shape + (1,) * (len(shape) - a.ndim))
    elif a.ndim > len(shape):
        extra = a.shape[len(shape):]
        if all(s == 1 for s in extra):
            a = a.reshape(a.shape[:len(shape)])
    return np.broadcast_to(a, shape)


def left_shape(shapes):
    """Broadcast shape of tile shapes under the left-aligned rule, or raise ValueError."""
    if shapes:
        first = shapes[0]
        for sh in shapes:
            if sh != first:
                break
        else:
            return tuple(first)
    rank = max((len(s) for s in shapes), default=0)
    padded = [tuple(s) + (1,) * (rank - len(s)) for s in shapes]
    return np.broadcast_shapes(*padded)
