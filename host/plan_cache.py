"""One plan per step for callers that only see one layer at a time (the torch ops).

A serving engine calls ``torch.ops.nki_pa.paged_attention`` once per layer with the same block
tables and lengths; a custom op cannot carry a Python plan between calls, so
:func:`cached_plan` keys plans by the exact CONTENT of their inputs (the bytes, shape and dtype
of the block tables and length vectors, plus every option) and keeps the most recent
:data:`CACHE_SIZE` plans. The first layer of a step builds the plan; the other layers of the
step find it. Plans are immutable, so threads may share them; the cache itself is guarded by a
lock. Per-layer values (sinks, ALiBi slopes, fp8 scales) are not part of the key: callers pass
each layer's own values to ``host.run_paged_attention``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from host._arrays import to_numpy
from host.step_plan import AttentionPlan, plan_paged_attention

__all__ = ["CACHE_SIZE", "cached_plan", "clear_plan_cache", "plan_cache_stats"]

CACHE_SIZE = 8
_LAYER_VALUES = ("alibi_slopes", "sinks", "k_scale", "v_scale")
_lock = threading.Lock()
_plans: OrderedDict = OrderedDict()
_stats = {"built": 0, "reused": 0}


def _array_key(name: str, x: Any) -> tuple:
    arr, _ = to_numpy(x, name)
    arr = np.ascontiguousarray(arr)
    return (arr.shape, arr.dtype.str, arr.tobytes())


def cached_plan(block_tables: Any, query_lens: Any, context_lens: Any,
                **options: Any) -> AttentionPlan:
    """``host.plan_paged_attention(block_tables, query_lens, context_lens, **options)``, reused
    when the same inputs and options were planned recently (module docstring). The per-layer
    values among ``options`` (alibi_slopes, sinks, k_scale, v_scale) enter the key only by
    presence; the plan keeps the values of the call that built it."""
    key = (_array_key("block_tables", block_tables), _array_key("query_lens", query_lens),
           _array_key("context_lens", context_lens),
           tuple(sorted((k, (v is not None) if k in _LAYER_VALUES else _hashable(v))
                        for k, v in options.items())))
    with _lock:
        plan = _plans.get(key)
        if plan is not None:
            _plans.move_to_end(key)
            _stats["reused"] += 1
            return plan
    plan = plan_paged_attention(block_tables, query_lens, context_lens, **options)
    with _lock:
        _plans[key] = plan
        _plans.move_to_end(key)
        while len(_plans) > CACHE_SIZE:
            _plans.popitem(last=False)
        _stats["built"] += 1
    return plan


def _hashable(value: Any) -> Any:
    """A key part that also tells apart values that compare equal across types (True, 1, 1.0)."""
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    try:
        hash(value)
    except TypeError:
        return (type(value).__name__, repr(value))
    return (type(value).__name__, value)


def clear_plan_cache() -> None:
    """Drop every cached plan and reset :func:`plan_cache_stats`."""
    with _lock:
        _plans.clear()
        _stats.update(built=0, reused=0)


def plan_cache_stats() -> dict:
    """``{"built": n, "reused": m}`` since the last :func:`clear_plan_cache`."""
    with _lock:
        return dict(_stats)
