"""ALU and activation function tables shared by ``nl`` and ``nisa``.

An ALU operator may be given as an ``nl`` function (``nl.add``), a NumPy ufunc / function
(``np.add``, ``np.max``) or a name; :func:`alu_name` maps all of them to one name.
Arithmetic is done in fp32 (Vector/Scalar engines), or exactly in int64 when every input is
an integer and the op is integer-exact (add, subtract, multiply, max, min, compare, bitwise).
"""

from __future__ import annotations

import math

import numpy as np

from . import errors as E
from .dtypes import as_f32

# name -> (function on compute arrays, integer-exact?, class)
ALU = {
    "add": (np.add, True, "arith"),
    "subtract": (np.subtract, True, "arith"),
    "multiply": (np.multiply, True, "arith"),
    "divide": (np.divide, False, "arith"),
    "maximum": (np.maximum, True, "arith"),
    "minimum": (np.minimum, True, "arith"),
    "power": (np.power, False, "arith"),
    "mod": (np.mod, True, "arith"),
    "fmod": (np.fmod, True, "arith"),
    "equal": (np.equal, True, "cmp"),
    "not_equal": (np.not_equal, True, "cmp"),
    "greater": (np.greater, True, "cmp"),
    "greater_equal": (np.greater_equal, True, "cmp"),
    "less": (np.less, True, "cmp"),
    "less_equal": (np.less_equal, True, "cmp"),
    "logical_and": (np.logical_and, True, "logic"),
    "logical_or": (np.logical_or, True, "logic"),
    "logical_xor": (np.logical_xor, True, "logic"),
    "bitwise_and": (np.bitwise_and, True, "bitvec"),
    "bitwise_or": (np.bitwise_or, True, "bitvec"),
    "bitwise_xor": (np.bitwise_xor, True, "bitvec"),
    "left_shift": (np.left_shift, True, "bitvec"),
    "right_shift": (np.right_shift, True, "bitvec"),
    "abs_max": (lambda a, b: np.maximum(np.abs(a), np.abs(b)), True, "arith"),
}

_NP_ALIASES = {
    np.add: "add", np.subtract: "subtract", np.multiply: "multiply", np.divide: "divide",
    np.true_divide: "divide", np.maximum: "maximum", np.minimum: "minimum", np.power: "power",
    np.mod: "mod", np.fmod: "fmod", np.equal: "equal", np.not_equal: "not_equal",
    np.greater: "greater", np.greater_equal: "greater_equal", np.less: "less",
    np.less_equal: "less_equal", np.logical_and: "logical_and", np.logical_or: "logical_or",
    np.logical_xor: "logical_xor", np.bitwise_and: "bitwise_and", np.bitwise_or: "bitwise_or",
    np.bitwise_xor: "bitwise_xor", np.left_shift: "left_shift", np.right_shift: "right_shift",
    np.max: "maximum", np.amax: "maximum", np.min: "minimum", np.amin: "minimum",
    np.sum: "add", np.prod: "multiply",
}


def _canonical(op, attr: str, aliases: dict):
    """Name of an op given as an nl function (tagged ``attr``), a NumPy callable or a string."""
    name = getattr(op, attr, None)
    if name is None:
        try:
            name = aliases.get(op)
        except TypeError:          # unhashable
            name = None
    if name is None and isinstance(op, str):
        name = op
    return name


def alu_name(op, api: str) -> str:
    """Canonical ALU op name of ``op`` (nl function, NumPy callable or string)."""
    name = _canonical(op, "_alu", _NP_ALIASES)
    if name not in ALU:
        raise ValueError(f"{api}: op must be an NKI ALU operator (nl.add, np.maximum, ...); got {op!r}")
    return name


# ---------------------------------------------------------------------------- activations
def _erf(x):
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), enough for fp32 results
    s = np.sign(x)
    a = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
               + 0.254829592) * t * np.exp(-a * a)
    return (s * y).astype(np.float32)


def _gelu(x):
    return (0.5 * x * (1.0 + _erf(x / np.float32(math.sqrt(2.0))))).astype(np.float32)


def _gelu_tanh(x):
    c = np.float32(math.sqrt(2.0 / math.pi))
    return (0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x ** 3)))).astype(np.float32)


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


ACT = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: (1.0 / np.sqrt(x)).astype(np.float32),
    "reciprocal": lambda x: (np.float32(1.0) / x).astype(np.float32),
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, np.float32(0)),
    "gelu": _gelu,
    "gelu_apprx_tanh": _gelu_tanh,
    "silu": lambda x: (x * _sigmoid(x)).astype(np.float32),
    "gelu_apprx_sigmoid": lambda x: (x * _sigmoid(np.float32(1.702) * x)).astype(np.float32),
    "softplus": lambda x: np.logaddexp(np.float32(0), x).astype(np.float32),
    "mish": lambda x: (x * np.tanh(np.logaddexp(np.float32(0), x))).astype(np.float32),
    "erf": _erf,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "arctan": np.arctan,
    "abs": np.abs,
    "sign": np.sign,
    "negative": np.negative,
    "square": np.square,
    "ceil": np.ceil,
    "floor": np.floor,
    "trunc": np.trunc,
    "copy": lambda x: x,
    "identity": lambda x: x,
}

_NP_ACT = {
    np.exp: "exp", np.log: "log", np.sqrt: "sqrt", np.tanh: "tanh", np.sin: "sin", np.cos: "cos",
    np.tan: "tan", np.arctan: "arctan", np.abs: "abs", np.absolute: "abs", np.sign: "sign",
    np.negative: "negative", np.square: "square", np.reciprocal: "reciprocal", np.ceil: "ceil",
    np.floor: "floor", np.trunc: "trunc", np.copy: "copy",
}


def act_name(op, api: str) -> str:
    """Canonical activation function name of ``op``; NotImplementedError if not emulated."""
    name = _canonical(op, "_act", _NP_ACT)
    if name not in ACT:
        raise E.not_emulated(f"{api}(op={getattr(op, '__name__', op)!r})",
                             f"supported activation functions: {sorted(ACT)}")
    return name


def apply_act(name: str, x: np.ndarray) -> np.ndarray:
    return np.asarray(ACT[name](as_f32(x)), dtype=np.float32)


# ---------------------------------------------------------------------------- reductions
REDUCE = {
    "add": np.add.reduce, "subtract": None, "multiply": np.multiply.reduce,
    "maximum": np.maximum.reduce, "minimum": np.minimum.reduce,
    "bitwise_and": np.bitwise_and.reduce, "bitwise_or": np.bitwise_or.reduce,
    "bitwise_xor": np.bitwise_xor.reduce, "logical_and": np.logical_and.reduce,
    "logical_or": np.logical_or.reduce, "logical_xor": np.logical_xor.reduce,
}


def reduce_values(name: str, v: np.ndarray, axis, keepdims=False) -> np.ndarray:
    fn = REDUCE.get(name)
    if fn is None:
        raise ValueError(f"'{name}' is not a legal reduction operator; use add, multiply, maximum, "
                         "minimum, bitwise or logical and/or/xor")
    return fn(v, axis=axis, keepdims=keepdims)
