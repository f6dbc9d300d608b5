"""FP8 KV caches: the two vLLM formats, how the NKI kernels see them, and the KV scales.

Formats (vLLM's fp8 KV-cache dtypes, as ml_dtypes):

    float8_e4m3fn  OCP E4M3: max finite 448, no inf, NaN = 0x7F / 0xFF
    float8_e5m2    max finite 57344, inf and NaN

Legacy NKI has ``nl.float8_e4m3`` (IEEE-style E4M3: max finite 240, +-inf = 0x78 / 0xF8, NaN =
0x79..0x7F and 0xF9..0xFF) and ``nl.float8_e5m2``, but no e4m3fn. Every byte pattern whose
e4m3fn value has |x| <= 240 means the same value in IEEE-style E4M3 (the 14 patterns of
exponent 1111 with mantissa 000..110 differ: e4m3fn 256..448 / -256..-448, e4m3 inf / NaN; checked
exhaustively in tests/host/test_fp8.py). Hence:

* the kernels read and write an e4m3fn cache through its zero-copy ``float8_e4m3`` byte view
  (:func:`kernel_cache_view`); an e5m2 cache is passed unchanged;
* the cache write saturates e4m3fn values to +-240 (:data:`SATURATION`), not vLLM's +-448, so
  every written byte is a pattern both formats agree on. Values that would quantize to
  256..448 are clipped to 240: choose ``k_scale`` / ``v_scale`` with ``amax / scale <= 240``.
  Block copies move bytes unchanged, whatever they hold.

Scales (vLLM convention): dequantized K = k_fp8 * k_scale, V = v_fp8 * v_scale; the write stores
round(x / scale). A scale is one float (per tensor) or one per KV head, shape (Hkv,).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from host._arrays import to_numpy
from host.validation import fail, summarize

__all__ = [
    "FP8_CACHE_DTYPES",
    "SATURATION",
    "as_cache_dtype",
    "is_fp8_cache_dtype",
    "kernel_cache_dtype",
    "kernel_cache_view",
    "normalize_kv_scales",
    "cache_write_row_scales",
]

E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
E4M3 = np.dtype(ml_dtypes.float8_e4m3)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
FP8_CACHE_DTYPES = (E4M3FN, E5M2)
_KERNEL_DTYPE = {E4M3FN: E4M3, E5M2: E5M2}
# Largest magnitude the cache write stores (e4m3fn: the IEEE-style E4M3 maximum, see above).
SATURATION = {E4M3FN: 240.0, E5M2: 57344.0}


def as_cache_dtype(arg: str, dtype: Any) -> np.dtype:
    """``dtype`` (NumPy / ml_dtypes type, dtype name, or torch dtype) as a floating np.dtype.

    ValueError for a non-floating dtype; NotImplementedError for an fp8 flavour other than
    float8_e4m3fn / float8_e5m2.
    """
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        dtype = str(dtype).removeprefix("torch.")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        fail(arg, "be a floating dtype", repr(dtype))
    if dt.kind == "V" and dt.name.startswith("float8"):
        if dt not in FP8_CACHE_DTYPES:
            raise NotImplementedError(f"{arg}: a {dt.name} KV cache is not supported; use "
                                      "float8_e4m3fn or float8_e5m2 (vLLM's fp8 formats)")
        return dt
    if dt.kind != "f" and dt.name != "bfloat16":
        fail(arg, "be a floating dtype", f"dtype {dt}")
    return dt


def is_fp8_cache_dtype(dtype: Any) -> bool:
    """True for float8_e4m3fn and float8_e5m2."""
    return np.dtype(dtype) in FP8_CACHE_DTYPES


def kernel_cache_dtype(dtype: Any) -> np.dtype:
    """The NKI dtype a kernel sees for a cache of ``dtype`` (e4m3fn -> float8_e4m3, else unchanged)."""
    dt = np.dtype(dtype)
    return _KERNEL_DTYPE.get(dt, dt)


def kernel_cache_view(cache: np.ndarray) -> np.ndarray:
    """The cache as the kernels see it: zero-copy, same bytes, e4m3fn reinterpreted as float8_e4m3.

    Writes through the view land in ``cache`` (it shares the memory).
    """
    dt = kernel_cache_dtype(cache.dtype)
    return cache if dt == cache.dtype else cache.view(dt)


def _scale(arg: str, value: Any, num_kv_heads: int) -> np.ndarray:
    """One scale argument -> float32 (Hkv,): a real number, a 0-d / 1-element array, or (Hkv,)."""
    if isinstance(value, (bool, np.bool_)):
        fail(arg, "be a positive finite float or an array of shape (num_kv_heads,)", repr(value))
    arr, _ = to_numpy(value, arg)
    if arr.dtype.kind not in "fiu" and arr.dtype.name != "bfloat16":
        fail(arg, "be a real number or a real array", f"dtype {arr.dtype}")
    if arr.shape not in ((), (1,), (num_kv_heads,)):
        fail(arg, f"be a float, a 1-element array or have shape (num_kv_heads,) = ({num_kv_heads},)",
             f"shape {arr.shape}")
    with np.errstate(over="ignore", divide="ignore"):
        out = np.broadcast_to(arr.astype(np.float32), (num_kv_heads,)).copy()
        inv = np.float32(1.0) / out
    if not np.all(np.isfinite(out)) or not np.all(out > 0):
        fail(arg, "hold finite values > 0 (in float32)", summarize(arr))
    if not np.all(np.isfinite(inv)):
        fail(arg, "hold values whose float32 reciprocal is finite", summarize(arr))
    out.setflags(write=False)
    return out


def normalize_kv_scales(kv_cache_dtype: Any, num_kv_heads: int, k_scale: Any,
                        v_scale: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Validate the KV scales against the cache dtype; float32 (Hkv,) read-only arrays or Nones.

    An fp8 cache requires both scales; any other cache takes neither (ValueError otherwise).
    """
    dt = as_cache_dtype("kv_cache_dtype", kv_cache_dtype)
    if not is_fp8_cache_dtype(dt):
        for arg, value in (("k_scale", k_scale), ("v_scale", v_scale)):
            if value is not None:
                fail(arg, f"be None for a {dt.name} KV cache (scales apply to float8_e4m3fn / "
                     "float8_e5m2 caches only)", summarize(value))
        return None, None
    for arg, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if value is None:
            fail(arg, f"be given for a {dt.name} KV cache (K = k_fp8 * k_scale, V = v_fp8 * v_scale)",
                 "None")
    return _scale("k_scale", k_scale, num_kv_heads), _scale("v_scale", v_scale, num_kv_heads)


def cache_write_row_scales(k_scale: np.ndarray, v_scale: np.ndarray, num_tokens: int) -> np.ndarray:
    """Per-row inverse scales for the fp8 cache write: float32 (T * Hkv, 2).

    Row q = t * Hkv + h (the (token, head) row order of ``cache_write_row_index``) holds
    ``[1 / k_scale[h], 1 / v_scale[h]]``, each reciprocal rounded once to float32; the kernel
    multiplies by it. Inverse: ``1 / out[:Hkv]`` recovers the per-head scales up to that rounding.
    """
    inv = np.stack([np.float32(1.0) / np.asarray(k_scale, np.float32),
                    np.float32(1.0) / np.asarray(v_scale, np.float32)], axis=1)   # (Hkv, 2)
    return np.ascontiguousarray(np.tile(inv, (num_tokens, 1)), dtype=np.float32)

