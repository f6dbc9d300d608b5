"""Host code: planning, block tables, masks, launch wrappers, and the float64 reference.

Public names follow vLLM's Neuron backend (``flash_attn_varlen_nkifunc``,
``reorder_context_mask``, ``reshape_and_cache``). Filled in by the host, kernel and
cache-op modules; see README.md.
"""
