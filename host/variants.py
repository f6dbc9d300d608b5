"""Attention-variant options: validation, normalization, and the standard ALiBi slopes.

The options (all default off) and their exact definitions are in docs/attention-variants.md.
In short, for query head h at absolute position p (the i-th new token of a sequence with
context c is at p = c + i) and a key at position k <= p:

    s = softmax_scale * q . k
    s += alibi_slopes[h] * (k - p)                      alibi_slopes
    s = logits_soft_cap * tanh(s / logits_soft_cap)     logits_soft_cap
    key visible iff p - sliding_window < k <= p         sliding_window (else just k <= p)
    out = sum_k e^(s_k - m) v_k / (e^(sinks[h] - m) + sum_k e^(s_k - m))     sinks (else no sink term)

and for an fp8 cache (float8_e4m3fn / float8_e5m2) the cached K = k_fp8 * k_scale[kv head],
V = v_fp8 * v_scale[kv head] (see host/fp8.py for the formats and the kernel view).

:func:`make_variants` (or the ``AttentionVariants`` constructor, which runs the same checks)
validates every option and normalizes it:

    sliding_window   int >= 1 or None
    logits_soft_cap  float > 0, finite, or None
    alibi_slopes     float32 (H,), finite, read-only, or None
    sinks            float32 (H,), finite, read-only, or None
    k_scale/v_scale  float32 (Hkv,) per KV head (a per-tensor float is broadcast), finite, > 0,
                     read-only; required for an fp8 cache, None otherwise

>>> v = make_variants(8, 2, "bfloat16", sliding_window=128)
>>> v.sliding_window, v.is_default, v.is_fp8
(128, False, False)
>>> make_variants(8, 2, "bfloat16").is_default
True
>>> alibi_slopes(4).tolist()
[0.25, 0.0625, 0.015625, 0.00390625]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from host._arrays import to_numpy
from host.fp8 import as_cache_dtype, is_fp8_cache_dtype, kernel_cache_dtype, normalize_kv_scales
from host.validation import check_int, fail, summarize

__all__ = ["AttentionVariants", "make_variants", "alibi_slopes"]


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The standard ALiBi slopes of BLOOM / vLLM for ``num_heads`` heads: float32 (H,).

    With n the largest power of two <= H: head i (1-based, i <= n) gets 2^(-8 i / n); the
    remaining H - n heads get 2^(-4 j / n) for j = 1, 3, 5, ... (the odd slopes of the 2n-head
    sequence).
    """
    h = check_int("num_heads", num_heads, min_value=1)
    n = 1 << (h.bit_length() - 1)
    main = [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]
    extra = [2.0 ** (-4.0 * j / n) for j in range(1, 2 * (h - n), 2)]
    return np.asarray(main + extra, dtype=np.float32)


def _readonly_f32(arg: str, value: Any, length: int, what: str) -> np.ndarray:
    """A finite real (length,) vector as a read-only float32 array."""
    arr, _ = to_numpy(value, arg)
    if arr.dtype.kind not in "fiu" and arr.dtype.name != "bfloat16":
        fail(arg, "be a real (float) array", f"dtype {arr.dtype}")
    if arr.shape != (length,):
        fail(arg, f"have shape ({what},) = ({length},)", f"shape {arr.shape}")
    with np.errstate(over="ignore"):
        out = arr.astype(np.float32)
    if not np.all(np.isfinite(out)):
        fail(arg, "hold finite values (in float32)", summarize(arr))
    out.setflags(write=False)
    return out


def _real(arg: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        fail(arg, "be a real number or None", repr(value))
    return float(value)


@dataclass(frozen=True, eq=False)
class AttentionVariants:
    """Validated, normalized attention-variant options (construct with :func:`make_variants`).

    Attributes:
        num_heads: H, query heads (>= 1).
        num_kv_heads: Hkv, KV heads (>= 1, divides H); query head h uses KV head h // (H // Hkv).
        kv_cache_dtype: np.dtype of the paged KV cache.
        sliding_window: W (int >= 1) or None: a query at position p sees keys p - W + 1 .. p.
        logits_soft_cap: c (float > 0) or None: s = c * tanh(s / c) after ALiBi, before masking.
        alibi_slopes: float32 (H,) or None: s += slope_h * (key_pos - query_pos).
        sinks: float32 (H,) or None: one extra logit per head in the softmax denominator only.
        k_scale, v_scale: float32 (Hkv,) or None (fp8 caches only, then both required).
    """

    num_heads: int
    num_kv_heads: int
    kv_cache_dtype: Any
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    alibi_slopes: np.ndarray | None = None
    sinks: np.ndarray | None = None
    k_scale: np.ndarray | None = None
    v_scale: np.ndarray | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        h = check_int("num_heads", self.num_heads, min_value=1)
        hkv = check_int("num_kv_heads", self.num_kv_heads, min_value=1)
        if h % hkv:
            fail("num_heads", f"be divisible by num_kv_heads = {hkv}", repr(h))
        put(self, "num_heads", h)
        put(self, "num_kv_heads", hkv)
        dt = as_cache_dtype("kv_cache_dtype", self.kv_cache_dtype)
        put(self, "kv_cache_dtype", dt)
        if self.sliding_window is not None:
            put(self, "sliding_window", check_int("sliding_window", self.sliding_window, min_value=1))
        if self.logits_soft_cap is not None:
            cap = _real("logits_soft_cap", self.logits_soft_cap)
            if not (math.isfinite(cap) and cap > 0):
                fail("logits_soft_cap", "be a finite number > 0 or None", repr(self.logits_soft_cap))
            put(self, "logits_soft_cap", cap)
        if self.alibi_slopes is not None:
            put(self, "alibi_slopes", _readonly_f32("alibi_slopes", self.alibi_slopes, h, "num_heads"))
        if self.sinks is not None:
            put(self, "sinks", _readonly_f32("sinks", self.sinks, h, "num_heads"))
        k, v = normalize_kv_scales(dt, hkv, self.k_scale, self.v_scale)
        put(self, "k_scale", k)
        put(self, "v_scale", v)

    @property
    def is_default(self) -> bool:
        """True when no option is on: plain causal softmax attention over a non-fp8 cache."""
        return all(getattr(self, f) is None for f in _OPTIONS)

    @property
    def is_fp8(self) -> bool:
        """True for a float8_e4m3fn / float8_e5m2 cache (k_scale and v_scale are then set)."""
        return is_fp8_cache_dtype(self.kv_cache_dtype)

    @property
    def kernel_cache_dtype(self) -> np.dtype:
        """The dtype the kernels see the cache in (float8_e4m3 for float8_e4m3fn; see host/fp8.py)."""
        return kernel_cache_dtype(self.kv_cache_dtype)

    def _key(self) -> tuple:
        return tuple(None if (x := getattr(self, f.name)) is None
                     else (x.tobytes() if isinstance(x, np.ndarray) else x) for f in fields(self))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AttentionVariants) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


_OPTIONS = ("sliding_window", "logits_soft_cap", "alibi_slopes", "sinks", "k_scale", "v_scale")


def make_variants(num_heads: int, num_kv_heads: int, kv_cache_dtype: Any, *,
                  sliding_window: int | None = None, logits_soft_cap: float | None = None,
                  alibi_slopes: Any = None, sinks: Any = None, k_scale: Any = None,
                  v_scale: Any = None) -> AttentionVariants:
    """Validate and normalize the attention-variant options (see the module docstring).

    Raises:
        ValueError: naming the argument, the constraint and the value, for: num_heads /
            num_kv_heads < 1 or H % Hkv != 0; a non-floating kv_cache_dtype; sliding_window not
            an int or < 1; logits_soft_cap not a real number, <= 0 or non-finite; alibi_slopes /
            sinks not of shape (H,) or non-finite; k_scale / v_scale not a float or (Hkv,),
            non-finite or <= 0; an fp8 cache without both scales; a scale for a non-fp8 cache.
        NotImplementedError: an fp8 cache dtype other than float8_e4m3fn / float8_e5m2.
    """
    return AttentionVariants(num_heads, num_kv_heads, kv_cache_dtype, sliding_window=sliding_window,
                             logits_soft_cap=logits_soft_cap, alibi_slopes=alibi_slopes, sinks=sinks,
                             k_scale=k_scale, v_scale=v_scale)
