"""Host code: planning, block tables, masks, launch wrappers, and the float64 reference.

Public names follow vLLM's Neuron backend where one exists (``flash_attn_varlen_nkifunc``,
``reorder_context_mask``, ``reshape_and_cache``, ``copy_blocks``, ``swap_blocks``), else vLLM's
cache ops (``concat_and_cache_mla``).

A serving step plans once and runs per layer: ``plan_paged_attention`` (a frozen, validated
``AttentionPlan``) and ``run_paged_attention(plan, query, key, value, kv_cache)``;
``paged_attention`` is the two in one call (``plan_mla_attention`` / ``run_mla_attention`` for
MLA). Pure-NumPy planning names (and the paged ``KVCacheManager``) are imported eagerly; the launch
wrappers (which import the kernels and, without ``neuronx-cc``, the ``nki_sim`` simulator) load
on first use. With the optional extras: ``host.serving.torch_ops`` (torch custom ops ``nki_pa::*``),
``host.serving.hf_backend`` and ``host.serving.generation`` (``host.generate``, ``host.PagedGenerator``: a
transformers attention backend and continuous-batching generation); see docs/integration.md.
Every layout these functions produce or consume is specified in ``docs/layouts.md``.
"""

from __future__ import annotations

import importlib

from host.dense.block_tables import (
    active_block_table,
    from_partition_first,
    inverse_transform_block_tables,
    load_column_tokens,
    loaded_cache_slots,
    to_partition_first,
    transform_block_tables,
    transform_block_tables_all_heads,
)
from host.serving.kv_manager import KVCacheManager, OutOfBlocksError
from host.dense.masks import (
    active_mask,
    build_attention_mask,
    context_mask,
    context_row_ranges,
    context_seq_ids,
    context_token_order,
    inverse_reorder_context_mask,
    query_seq_ids,
    reorder_context_mask,
)
from host.mla.mla import MLAPlan, check_mla_inputs
from host.cache.mla_layout import allocate_mla_cache, gather_mla_entries, mla_entry_size
from host.mla.mla_reference import mla_paged_attention_ref
from host.dense.plan import PagedAttentionPlan, make_plan
from host.reference import paged_attention_ref
from host.scheduled.schedule import AttentionSchedule, make_schedule
from host.step_plan import AttentionPlan, ClassPlan, plan_paged_attention
from host.variants import AttentionVariants, alibi_slopes, make_variants

# name -> submodule, loaded lazily (these pull in nki_kernels and the NKI backend).
_LAZY = {
    "paged_attention": "host.attention",
    "run_paged_attention": "host.attention",
    "flash_attn_varlen_nkifunc": "host.attention",
    "reshape_and_cache": "host.cache.cache_ops",
    "copy_blocks": "host.cache.cache_ops",
    "swap_blocks": "host.cache.cache_ops",
    "allocate_kv_caches": "host.cache.cache_ops",
    "concat_and_cache_mla": "host.cache.mla_cache",
    "mla_paged_attention": "host.mla.mla_attention",
    "plan_mla_attention": "host.mla.mla_attention",
    "run_mla_attention": "host.mla.mla_attention",
}
# name -> submodule that needs the optional torch (+ transformers) extras; kept out of __all__
# so that ``from host import *`` works without them.
_LAZY_OPTIONAL = {
    "generate": "host.serving.generation",
    "PagedGenerator": "host.serving.generation",
}


def __getattr__(name: str):
    module = _LAZY.get(name) or _LAZY_OPTIONAL.get(name)
    if module is None:
        raise AttributeError(f"module 'host' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_OPTIONAL))


__all__ = [
    "AttentionPlan", "ClassPlan", "plan_paged_attention", "PagedAttentionPlan", "make_plan",
    "active_block_table", "transform_block_tables", "transform_block_tables_all_heads",
    "inverse_transform_block_tables", "to_partition_first", "from_partition_first",
    "load_column_tokens", "loaded_cache_slots",
    "context_mask", "active_mask", "reorder_context_mask", "inverse_reorder_context_mask",
    "build_attention_mask", "context_token_order", "context_row_ranges", "query_seq_ids",
    "context_seq_ids",
    "paged_attention_ref", "AttentionSchedule", "make_schedule",
    "allocate_mla_cache", "mla_entry_size", "gather_mla_entries", "check_mla_inputs", "MLAPlan",
    "mla_paged_attention_ref",
    "AttentionVariants", "make_variants", "alibi_slopes",
    "KVCacheManager", "OutOfBlocksError",
    *_LAZY,
]
