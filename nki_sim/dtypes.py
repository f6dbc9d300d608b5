"""NKI dtypes (NumPy dtype objects, bf16/fp8 through ml_dtypes), type promotion and write casts.

* ``promote(a, b)``: NKI type promotion (API notes §2.6); Python scalars count as
  bool -> uint8, int -> int32, float -> float32.
* ``cast_for_write(values, dtype)``: what every write into memory does: float -> float
  round-to-nearest-even (ml_dtypes), float -> int round-to-nearest-even then saturate
  (NaN -> 0), int -> int saturate, anything -> bool is ``!= 0``.
* ``poison(dtype)``: fill value of fresh memory: NaN for floats, the maximum for ints.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
int8, int16, int32 = np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)
uint8, uint16, uint32 = np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32)
bool_ = np.dtype(np.bool_)
tfloat32 = np.dtype("V4")   # legacy nl.tfloat32 is an opaque 4-byte type

SUPPORTED = {float32, float16, bfloat16, float8_e4m3, float8_e5m2,
             int8, int16, int32, uint8, uint16, uint32, bool_}
# extra fp8 flavours ml_dtypes knows; accepted as storage types
for _n in ("float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e4m3b11fnuz"):
    if hasattr(ml_dtypes, _n):
        SUPPORTED.add(np.dtype(getattr(ml_dtypes, _n)))


_NAMES: dict = {}


def dname(d) -> str:
    """``np.dtype(d).name``, cached (the NumPy property is slow)."""
    try:
        return _NAMES[d]
    except KeyError:
        n = _NAMES[d] = np.dtype(d).name
        return n
    except TypeError:            # unhashable
        return np.dtype(d).name


def as_dtype(dt, what: str = "dtype") -> np.dtype:
    """Normalize a dtype argument (np type, np.dtype, string, ml_dtypes type) to np.dtype."""
    try:
        d = np.dtype(dt)
    except TypeError:
        raise ValueError(f"{what} must be an NKI dtype; got {dt!r}") from None
    if d not in SUPPORTED:
        raise ValueError(f"{what} must be one of the NKI dtypes (float32, float16, bfloat16, "
                         f"float8_e4m3, float8_e5m2, (u)int8/16/32, bool); got {d.name}")
    return d


_FLOAT_DTYPES = {float32, float16, bfloat16, np.dtype(np.float64)} | {
    d for d in SUPPORTED if d.name.startswith("float8")}


def is_float(d: np.dtype) -> bool:
    if d in _FLOAT_DTYPES:
        return True
    return d.kind == "f" or d.name.startswith("float8")


def is_int(d: np.dtype) -> bool:
    return d.kind in "iu"


def scalar_dtype(x) -> np.dtype:
    """dtype NKI assigns to a Python / NumPy scalar operand."""
    if isinstance(x, (bool, np.bool_)):
        return uint8
    if isinstance(x, np.generic):
        return np.dtype(x.dtype)
    if isinstance(x, int):
        return int32
    if isinstance(x, float):
        return float32
    raise TypeError(f"unsupported scalar operand {x!r}")


_FBITS = {float32: 32, float16: 16, bfloat16: 16}


def _float_rank(d):
    return d.itemsize


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """NKI type promotion of two dtypes (API notes §2.6)."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return bool_ if a == bool_ else a
    if a == bool_:
        a = uint8
    if b == bool_:
        b = uint8
    if a == b:
        return a
    fa, fb = is_float(a), is_float(b)
    if fa and not fb:
        return a
    if fb and not fa:
        return b
    if fa and fb:
        if float32 in (a, b):
            return float32
        if {a, b} == {float16, bfloat16}:
            return float32
        if a.itemsize != b.itemsize:
            return a if a.itemsize > b.itemsize else b
        return bfloat16          # two different fp8 flavours
    # int, int
    sa, sb = a.kind == "i", b.kind == "i"
    if sa == sb:
        return a if a.itemsize >= b.itemsize else b
    s, u = (a, b) if sa else (b, a)
    if s.itemsize > u.itemsize:
        return s
    widened = u.itemsize * 2
    if widened > 4:
        return float32
    return np.dtype(f"int{widened * 8}")


def promote_all(dts) -> np.dtype:
    out = None
    for d in dts:
        out = d if out is None else promote(out, d)
    return out


def poison_value(d: np.dtype):
    if is_float(d):
        return np.nan
    if d == bool_:
        return True
    return np.iinfo(d).max


def plain_cast(src: np.dtype, d: np.dtype) -> bool:
    """Whether :func:`cast_for_write` from ``src`` to ``d`` is NumPy's own (unsafe) cast, so a
    copy into storage may convert on the fly (float -> float, or no conversion at all)."""
    # float64 -> narrower than fp32 goes through fp32 (cast_for_write), never a plain cast
    if src == np.float64 and d != float32 and d != np.float64:
        return False
    return src == d or (src in _FLOAT_DTYPES and d in _FLOAT_DTYPES)


def cast_for_write(values, d: np.dtype) -> np.ndarray:
    """Convert an array (any dtype) to storage dtype ``d`` with the hardware write rules."""
    v = values if type(values) is np.ndarray else np.asarray(values)
    if v.dtype == d:
        return v
    if d == bool_:
        return v != 0
    if is_int(d):
        info = np.iinfo(d)
        if is_float(v.dtype) or v.dtype.kind == "f":
            f = np.asarray(v, dtype=np.float64)
            f = np.rint(f)
            f = np.where(np.isnan(f), 0.0, f)
            return np.clip(f, info.min, info.max).astype(d)
        if v.dtype == bool_:
            return v.astype(d)
        return np.clip(v.astype(np.int64), info.min, info.max).astype(d)
    # float destination
    if v.dtype == bool_:
        v = v.astype(np.uint8)
    if d in (bfloat16, float16, float32) or d.name.startswith("float8"):
        # engine values (and Python float immediates) are fp32: a float64 source is rounded to
        # fp32 first, then to a narrower destination (one rounding from float64 straight to
        # bf16 would differ at midpoints, and ml_dtypes >= 0.7 does exactly that)
        if (v.dtype.kind in "iu" or v.dtype == np.float64) and d != float32:
            v = v.astype(np.float32)
        return v.astype(d)
    return v.astype(d)


_WIDEN_MIN = 32768      # below this many elements ml_dtypes' own cast is as fast


def as_f32(v) -> np.ndarray:
    """``np.asarray(v, dtype=float32)``; a large bf16 array is widened by shifting its bits
    (exact, the same values as the ml_dtypes cast, several times faster)."""
    if type(v) is np.ndarray and v.dtype == bfloat16 and v.size >= _WIDEN_MIN:
        out = np.empty(v.shape, np.uint32)
        np.left_shift(v.view(np.uint16), 16, out=out, dtype=np.uint32)
        return out.view(np.float32)
    return np.asarray(v, dtype=np.float32)


def compute_dtype(dts, int_exact: bool) -> np.dtype:
    """Internal math dtype: int64 when every input is an integer and the op is exact, else fp32."""
    if int_exact and all(is_int(d) or d == bool_ for d in dts):
        return np.dtype(np.int64)
    return float32
