"""Dtypes of the current ``nki`` API: strings (``nl.bfloat16 == "bfloat16"``) mapped to storage.

``NKI_PRECISE_FP=0`` (read at each launch; AWS's default is 1 since NKI 0.4) stores bf16 / fp16 /
fp8 on-chip and output tensors as fp32 like AWS's simulator; values are cast to the declared
dtype when outputs are returned.

``to_np(dt)`` gives the NumPy storage dtype (bf16 / fp8 through ml_dtypes) of a dtype string;
NumPy / ml_dtypes dtype objects are accepted too (AWS documents strings only).  ``tfloat32``
is stored as fp32 (reads and writes do not round to tf32: see nki_sim/README.md).  The NKI 0.5+
packed types (``float8_e8m0fnu``, ``*_x4``) are not emulated.
"""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np

from .. import dtypes as D
from ..errors import NotEmulatedError

_STORAGE = {
    "float32": D.float32, "float16": D.float16, "bfloat16": D.bfloat16, "tfloat32": D.float32,
    "float8_e4m3": D.float8_e4m3, "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": D.float8_e5m2,
    "int8": D.int8, "int16": D.int16, "int32": D.int32,
    "uint8": D.uint8, "uint16": D.uint16, "uint32": D.uint32, "bool": D.bool_,
}
_PACKED = ("float8_e8m0fnu", "float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4")
_BY_NP = {}
for _k, _v in _STORAGE.items():
    if _k != "tfloat32":
        _BY_NP.setdefault(_v, _k)
del _k, _v


def name_of(dt) -> str:
    """The NKI dtype string of ``dt`` (a string or a NumPy / ml_dtypes dtype)."""
    if isinstance(dt, str):
        if dt in _STORAGE:
            return dt
        if dt in _PACKED:
            raise NotEmulatedError(f"nki.language.{dt} (packed / MX dtype) is not emulated by nki_sim")
        if dt == "bool_":
            return "bool"
        raise ValueError(f"dtype must be an NKI dtype (nl.float32, nl.bfloat16, ...); got {dt!r}")
    try:
        d = np.dtype(dt)
    except TypeError:
        raise ValueError(f"dtype must be an NKI dtype (nl.float32, nl.bfloat16, ...); got {dt!r}") from None
    if d not in _BY_NP:
        raise ValueError(f"dtype must be an NKI dtype (nl.float32, nl.bfloat16, (u)int8/16/32, ...); "
                         f"got {d.name}")
    return _BY_NP[d]


class _Precise(threading.local):
    def __init__(self):
        self.on = True


_precise = _Precise()


def set_precise(on: bool) -> None:
    """Per thread: whether narrow float tensors are stored in their own dtype (NKI_PRECISE_FP)."""
    _precise.on = bool(on)


def to_np(dt) -> np.dtype:
    """Storage dtype (NumPy) of an NKI dtype string or NumPy dtype."""
    n = name_of(dt)
    if not _precise.on and n in _NARROW:
        return D.float32
    return _STORAGE[n]


def declared_np(dt) -> np.dtype:
    """The declared dtype's NumPy type, whatever the storage (outputs are returned in it)."""
    return _STORAGE[name_of(dt)]


def precise() -> bool:
    return _precise.on


def itemsize(dt) -> int:
    return _STORAGE[name_of(dt)].itemsize


_NARROW = ("bfloat16", "float16", "float8_e4m3", "float8_e4m3fn", "float8_e5m2")


def is_float_name(dt) -> bool:
    return name_of(dt).startswith(("float", "bfloat", "tfloat"))
