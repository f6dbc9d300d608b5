"""Hugging Face transformers attention backend ``"nki_paged"``: attention through the paged KV cache.

    import host.serving.hf_backend as hf
    hf.register()                                    # AttentionInterface.register("nki_paged", ...)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="nki_paged")
    model(input_ids=(1, T), position_ids=(1, T), use_cache=False, nki_paged=PagedBatch(...))

A forward runs on a FLAT batch (docs/layouts.md §15): the new tokens of S sequences concatenated
into one row, ``input_ids`` / ``position_ids`` of shape (1, T), positions absolute within each
sequence (so rotary embeddings are right), and the transformers cache disabled
(``use_cache=False``): the K/V history lives in this module's paged cache, described by the
:class:`PagedBatch` passed as the keyword ``nki_paged`` (transformers forwards it to every
attention call). Each attention layer then does

    reshape_and_cache(k, v, kv_caches[layer], slot_mapping)        # new tokens into the cache
    out = paged_attention(q, k, v, kv_caches[layer], block_tables, query_lens, context_lens)

through the ``nki_pa`` torch ops (``host.serving.torch_ops``: the host API on CPU tensors, the NKI
kernels on XLA tensors). ``host.serving.generation.PagedGenerator`` builds the PagedBatch for a
continuously batched generation loop.

Attention variants are taken from what the model passes to its attention function and handed to
``host.paged_attention``: ``sliding_window`` (Mistral, Qwen2 sliding layers, Gemma 2, GPT-OSS;
HF semantics: a query at position p sees keys p-W+1..p), ``softcap`` -> ``logits_soft_cap``
(Gemma 2 ``attn_logit_softcapping``), ``s_aux`` -> ``sinks`` (GPT-OSS). A sliding window no
sequence of the batch reaches (every sequence no longer than W) changes nothing and is not
passed; any other set option the installed ``host.paged_attention`` does not accept raises
NotImplementedError (``host.serving.torch_ops.host_options``).

Requires torch and transformers (optional extras ``torch`` and ``hf``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

import host.serving.torch_ops  # noqa: F401  (registers torch.ops.nki_pa)
from host.validation import fail

__all__ = ["ATTN_IMPLEMENTATION", "PagedBatch", "register", "paged_attention_forward",
           "to_flat_tokens", "from_flat_tokens"]

ATTN_IMPLEMENTATION = "nki_paged"


@dataclass(frozen=True)
class PagedBatch:
    """The paged-cache view of one flat-batch forward (S sequences, T = sum(query_lens) tokens).

    Attributes:
        kv_caches: (L, 2, N, Hkv, B, d) tensor, layer i's cache is ``kv_caches[i]``; written in
            place (the new tokens' K/V), same dtype as the model.
        slot_mapping: (T,) int64 cache slot of every new token (``KVCacheManager.append_slots``).
        block_tables: (S, max_blocks) int32, each row covering context and new tokens.
        query_lens: (S,) int64 new tokens per sequence (>= 1).
        context_lens: (S,) int64 tokens of each sequence already in the cache before this forward.
        mixed_precision, large_tile_size, kernel: passed to ``paged_attention`` (``kernel``
            None = the host default; ``large_tile_size`` None = "auto"; mixed_precision False by default: results as eager).
        k_scale, v_scale: for an fp8 cache (float8_e4m3fn / float8_e5m2), its dequantization
            scales (0-d or (Hkv,) float32 tensors), passed to both cache write and attention.
    """

    kv_caches: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_lens: torch.Tensor
    context_lens: torch.Tensor
    mixed_precision: bool = False
    large_tile_size: int | None = None
    kernel: str | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    max_seq_len: int = field(init=False)

    def __post_init__(self) -> None:
        if self.kv_caches.dim() != 6 or self.kv_caches.shape[1] != 2:
            fail("kv_caches", "have shape (L, 2, num_blocks, Hkv, block_size, d)",
                 f"shape {tuple(self.kv_caches.shape)}")
        if self.query_lens.shape != self.context_lens.shape or self.query_lens.dim() != 1:
            fail("query_lens / context_lens", "be (S,) each",
                 f"shapes {tuple(self.query_lens.shape)} / {tuple(self.context_lens.shape)}")
        total = int((self.query_lens + self.context_lens).max()) if self.query_lens.numel() else 0
        object.__setattr__(self, "max_seq_len", total)


def register(name: str = ATTN_IMPLEMENTATION) -> str:
    """Register :func:`paged_attention_forward` in transformers' ``AttentionInterface``.

    No attention-mask function is registered, so transformers builds no mask for this
    implementation (masking is by the paged lengths). Returns ``name``.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(name, paged_attention_forward)
    return name


def to_flat_tokens(x: torch.Tensor) -> torch.Tensor:
    """HF (1, heads, T, d) -> the host's (T, heads, d) (docs/layouts.md §15)."""
    if x.dim() != 4 or x.shape[0] != 1:
        fail("query / key / value", "be (1, heads, T, d): a flat batch of one row",
             f"shape {tuple(x.shape)}")
    return x[0].transpose(0, 1).contiguous()


def from_flat_tokens(x: torch.Tensor) -> torch.Tensor:
    """Host (T, H, d) -> HF's attention output layout (1, T, H, d) (docs/layouts.md §15)."""
    return x.unsqueeze(0)


def paged_attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: Any, scaling: float | None = None,
                            dropout: float = 0.0, sliding_window: int | None = None,
                            softcap: float | None = None, s_aux: torch.Tensor | None = None,
                            nki_paged: PagedBatch | None = None, **kwargs: Any):
    """transformers attention function: (1, H, T, d) query, (1, Hkv, T, d) new K/V ->
    ((1, T, H, d) output, None). ``module.layer_idx`` selects the layer's cache."""
    if not isinstance(nki_paged, PagedBatch):
        fail("nki_paged", "be a host.serving.hf_backend.PagedBatch passed to the model's forward (see "
             "host.serving.generation.PagedGenerator)", repr(type(nki_paged).__name__))
    if dropout:
        raise NotImplementedError(f"attention dropout ({dropout}) is not supported by the paged "
                                  "backend; call model.eval() (inference only)")
    if attention_mask is not None:
        raise NotImplementedError("an explicit attention mask is not supported by the paged "
                                  "backend; sequences are delimited by nki_paged.query_lens")
    meta = nki_paged
    q, k, v = to_flat_tokens(query), to_flat_tokens(key), to_flat_tokens(value)
    cache = meta.kv_caches[module.layer_idx]
    if sliding_window is not None and meta.max_seq_len <= sliding_window:
        sliding_window = None  # no query can see farther back than W tokens: the window is inert
    scales = dict(k_scale=meta.k_scale, v_scale=meta.v_scale)
    torch.ops.nki_pa.reshape_and_cache(k, v, cache, meta.slot_mapping, **scales)
    out = torch.ops.nki_pa.paged_attention(
        q, k, v, cache, meta.block_tables, meta.query_lens, meta.context_lens,
        softmax_scale=scaling, mixed_precision=meta.mixed_precision,
        large_tile_size=meta.large_tile_size, attention_kernel=meta.kernel,
        sliding_window=sliding_window,
        logits_soft_cap=softcap, sinks=s_aux, **scales)
    return from_flat_tokens(out), None
