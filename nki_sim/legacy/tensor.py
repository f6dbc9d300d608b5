"""The legacy ``neuronxcc.nki`` tensor: the core :class:`~nki_sim.tensor.Tensor` plus legacy semantics.

What the legacy API adds to a view (API notes §2-§3):

* op results: ``fresh`` (an op's result tile not yet assigned anywhere; ``"pe"`` for a TensorE
  result that ``psum += ...`` may accumulate, ``"acc"`` for the view an in-place update
  returns), ``pmask`` (bool mask, shape ``shape``, of the elements the producing op wrote, or
  None when all were) and ``producer`` (``(engine, op[, source dtype])`` of that instruction);
* assignment ``t[key] = value`` and ``t += value`` (:mod:`nki_sim.legacy.assign`);
* operators ``+ - * / ** % < <= > >= == != & | ^ << >> ~ -x abs()`` (VectorE element-wise
  ops of :mod:`nki_sim.legacy.language.elementwise`), ``.astype`` (``nl.copy``),
  ``.broadcast_to`` and ``.T`` (``nl.transpose``).

Views of a LegacyTensor are LegacyTensors (the core keeps the class of the parent view), and a
legacy launch creates its inputs and op results as LegacyTensors (``tensor_type``).
"""

from __future__ import annotations

from ..tensor import Tensor
from . import assign as _assign
from .language import elementwise as _ew
from .language.tensor_engine import transpose as _transpose


class LegacyTensor(Tensor):
    __slots__ = ("fresh", "pmask", "producer")
    __array_priority__ = 100
    __array_ufunc__ = None      # NumPy scalars / ufuncs defer to the NKI operators

    def __init__(self, alloc, arr, idx=None, shape=None, indirect=None, pax=0, lay=None):
        Tensor.__init__(self, alloc, arr, idx, shape, indirect, pax, lay)
        self.fresh = False      # result of an op not yet assigned anywhere
        self.pmask = None       # bool mask of the elements the producing op wrote
        self.producer = None    # (engine, op) of the instruction that produced a fresh tile

    def __setitem__(self, key, value):
        _assign.assign(self, key, value)

    def astype(self, dtype):
        return _ew.copy(self, dtype=dtype)

    def broadcast_to(self, shape):
        return _ew.broadcast_to(self, shape=tuple(shape))

    @property
    def T(self):
        return _transpose(self)

    # ---- operators (Vector engine element-wise ops) -------------------------------------
    def _op(name, reverse=False):
        def f(self, other):
            fn = getattr(_ew, name)      # operators exist in every simulated SDK
            return fn(other, self, _operator=True) if reverse else fn(self, other, _operator=True)
        f.__name__ = name
        return f

    __add__ = _op("add"); __radd__ = _op("add", True)
    __sub__ = _op("subtract"); __rsub__ = _op("subtract", True)
    __mul__ = _op("multiply"); __rmul__ = _op("multiply", True)
    __truediv__ = _op("divide"); __rtruediv__ = _op("divide", True)
    __pow__ = _op("power"); __rpow__ = _op("power", True)
    __mod__ = _op("mod"); __rmod__ = _op("mod", True)
    __lt__ = _op("less"); __le__ = _op("less_equal")
    __gt__ = _op("greater"); __ge__ = _op("greater_equal")
    __eq__ = _op("equal"); __ne__ = _op("not_equal")
    __and__ = _op("bitwise_and"); __rand__ = _op("bitwise_and", True)
    __or__ = _op("bitwise_or"); __ror__ = _op("bitwise_or", True)
    __xor__ = _op("bitwise_xor"); __rxor__ = _op("bitwise_xor", True)
    __lshift__ = _op("left_shift"); __rshift__ = _op("right_shift")
    del _op
    __hash__ = Tensor.__hash__

    def __neg__(self):
        return _ew.negative(self)

    def __invert__(self):
        return _ew.invert(self)

    def __abs__(self):
        return _ew.abs(self)

    def __iadd__(self, other): return _assign.inplace_update(self, other, "add")
    def __isub__(self, other): return _assign.inplace_update(self, other, "subtract")
    def __imul__(self, other): return _assign.inplace_update(self, other, "multiply")
    def __itruediv__(self, other): return _assign.inplace_update(self, other, "divide")
