"""Greedy generation with continuous batching for a transformers model on the ``nki_paged`` backend.

    gen = PagedGenerator(model, num_blocks=64, block_size=16, max_num_seqs=4, max_step_tokens=32)
    for prompt in prompts:
        gen.add_request(prompt, max_new_tokens=32)
    outputs = gen.run()                      # {request_id: GenerationOutput}
    # or: generate(model, prompts, max_new_tokens=32, num_blocks=64)

Each :meth:`PagedGenerator.step` is ONE model forward over a flat batch (host.serving.hf_backend):

1. admit waiting requests (FIFO) while fewer than ``max_num_seqs`` run and the free blocks cover
   their worst case (prompt + max_new_tokens - 1 cached tokens) on top of what the running
   sequences may still allocate -- so no running sequence ever runs out of blocks; prompts whose
   leading full blocks are already cached (prefix sharing) start after them;
2. schedule up to ``max_step_tokens`` tokens: one token per decoding sequence first, then prompt
   chunks of the prefilling sequences in admission order (chunked prefill);
3. allocate their cache slots (``KVCacheManager.append_slots``), run the model with
   ``nki_paged=PagedBatch(...)`` and logits only at each sequence's last token;
4. every sequence whose prompt is now fully in the cache takes its greedy next token; sequences
   with ``max_new_tokens`` tokens or the EOS token finish and free their blocks, making room for
   waiting ones.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Sequence

import numpy as np
import torch

from host.serving.hf_backend import ATTN_IMPLEMENTATION, PagedBatch
from host.serving.kv_manager import KVCacheManager
from host.validation import check_int, fail

__all__ = ["PagedGenerator", "GenerationOutput", "generate"]


@dataclass
class GenerationOutput:
    """One finished request: prompt, generated token ids, and (if recorded) their logits."""

    request_id: Hashable
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] | None = None   # one (vocab,) float32 row per generated token
    finish_reason: str = ""                  # "length" or "eos"


@dataclass
class _Request:
    out: GenerationOutput
    max_new_tokens: int
    eos_token_id: int | None
    computed: int = 0                        # tokens whose K/V are in the cache

    @property
    def all_tokens(self) -> list[int]:
        return self.out.prompt + self.out.tokens


class PagedGenerator:
    """Continuous-batching greedy decoder over a paged KV cache (module docstring).

    Args:
        model: a transformers causal LM built with ``attn_implementation="nki_paged"``
            (``host.serving.hf_backend.register()`` first), in eval mode.
        num_blocks, block_size: the paged cache (one (L, 2, N, Hkv, B, d) tensor in the model's
            dtype, ``self.kv_caches``).
        max_num_seqs: sequences running at once.  max_step_tokens: tokens per forward
            (>= max_num_seqs, so every decoding sequence advances every step).
        prefix_sharing: reuse cached full blocks of identical prompt prefixes.
        mixed_precision: ``paged_attention``'s option; default False, so an fp32 model's greedy
            tokens equal those of transformers' eager attention (True: bf16 matmul inputs, faster
            on hardware, but near-tied tokens may differ from eager).
        large_tile_size, kernel: ``paged_attention`` options (None = the host default:
            ``large_tile_size="auto"``, the scheduled kernel).
        kv_cache_dtype: cache dtype (default: the model's); ``torch.float8_e4m3fn`` /
            ``torch.float8_e5m2`` store K and V quantized with ``k_scale`` / ``v_scale`` (floats or
            (Hkv,) per KV head; required for fp8).
        record_logits: keep the logits row of every generated token.
    """

    def __init__(self, model: Any, *, num_blocks: int, block_size: int = 16, max_num_seqs: int = 8,
                 max_step_tokens: int = 256, prefix_sharing: bool = True,
                 mixed_precision: bool = False, large_tile_size: int | None = None,
                 kernel: str | None = None, kv_cache_dtype: torch.dtype | None = None,
                 k_scale: Any = None, v_scale: Any = None, record_logits: bool = False) -> None:
        impl = getattr(model.config, "_attn_implementation", None)
        if impl != ATTN_IMPLEMENTATION:
            fail("model", f"use attn_implementation={ATTN_IMPLEMENTATION!r}", repr(impl))
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, min_value=1)
        self.max_step_tokens = check_int("max_step_tokens", max_step_tokens,
                                         min_value=self.max_num_seqs)
        cfg = model.config.get_text_config()
        self.vocab_size = int(cfg.vocab_size)
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        dtype = next(model.parameters()).dtype if kv_cache_dtype is None else kv_cache_dtype
        self.model = model
        self.kv_caches = torch.zeros((cfg.num_hidden_layers, 2, num_blocks, kv_heads, block_size,
                                      head_dim), dtype=dtype)
        self.manager = KVCacheManager(num_blocks, block_size, kv_caches=self.kv_caches,
                                      prefix_sharing=prefix_sharing)
        self.mixed_precision = bool(mixed_precision)
        self.large_tile_size = large_tile_size
        self.kernel = kernel
        self.k_scale, self.v_scale = (None if x is None else torch.as_tensor(x, dtype=torch.float32)
                                      for x in (k_scale, v_scale))
        self.record_logits = bool(record_logits)
        self._ids = itertools.count()
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self.finished: dict[Hashable, GenerationOutput] = {}
        self.stats = {"steps": 0, "max_running": 0, "mixed_steps": 0, "chunked_prompts": 0,
                      "prefix_tokens_reused": 0, "joined_after_finish": 0}

    # ------------------------------------------------------------------ requests

    def add_request(self, prompt: Iterable[int], max_new_tokens: int, *,
                    request_id: Hashable | None = None, eos_token_id: int | None = None) -> Hashable:
        """Queue a prompt (token ids, >= 1); returns its request id."""
        toks = [int(t) for t in prompt]
        if not toks:
            fail("prompt", "hold at least one token id", "an empty prompt")
        bad = [t for t in toks if not 0 <= t < self.vocab_size]
        if bad:
            fail("prompt", f"hold token ids in [0, vocab_size={self.vocab_size})",
                 f"token id {bad[0]} at position {toks.index(bad[0])}")
        n_new = check_int("max_new_tokens", max_new_tokens, min_value=1)
        rid = next(self._ids) if request_id is None else request_id
        known = {r.out.request_id for r in itertools.chain(self._waiting, self._running)}
        if rid in known or rid in self.finished:
            fail("request_id", "be unique", repr(rid))
        if self._blocks(len(toks) + n_new - 1) > self.manager.num_blocks:
            fail("prompt", f"fit the cache with max_new_tokens ({self.manager.num_blocks} blocks of "
                 f"{self.manager.block_size})", f"{len(toks)} + {n_new} tokens")
        self._waiting.append(_Request(GenerationOutput(rid, toks, logits=[] if self.record_logits
                                                       else None), n_new, eos_token_id))
        return rid

    @property
    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def run(self) -> dict[Hashable, GenerationOutput]:
        """Step until every request has finished; returns ``self.finished``."""
        while self.has_unfinished:
            self.step()
        return self.finished

    # ------------------------------------------------------------------ one forward

    def step(self) -> list[Hashable]:
        """Admit, schedule, run one forward, sample; returns the ids finished in this step."""
        self._admit()
        batch = self._schedule()
        if not batch:
            return []
        mgr = self.manager
        ids, pos, slots, qlens, clens = [], [], [], [], []
        for r, n in batch:
            toks = r.all_tokens[r.computed:r.computed + n]
            slots.append(mgr.append_slots(r.out.request_id, token_ids=toks))
            ids.extend(toks)
            pos.extend(range(r.computed, r.computed + n))
            qlens.append(n)
            clens.append(r.computed)
        meta = PagedBatch(
            kv_caches=self.kv_caches, slot_mapping=torch.from_numpy(np.concatenate(slots)),
            block_tables=torch.from_numpy(mgr.block_tables([r.out.request_id for r, _ in batch])),
            query_lens=torch.tensor(qlens), context_lens=torch.tensor(clens),
            mixed_precision=self.mixed_precision, large_tile_size=self.large_tile_size,
            kernel=self.kernel, k_scale=self.k_scale, v_scale=self.v_scale)
        last = torch.tensor(np.cumsum(qlens) - 1)
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]),
                                use_cache=False, logits_to_keep=last, nki_paged=meta).logits[0]
        done = []
        for i, (r, n) in enumerate(batch):
            r.computed += n
            mgr.mark_computed(r.out.request_id)
            if r.computed == len(r.all_tokens) and self._sample(r, logits[i]):
                done.append(r.out.request_id)
        self.stats["steps"] += 1
        self.stats["mixed_steps"] += any(n > 1 for _, n in batch) and any(n == 1 for _, n in batch)
        return done

    def _admit(self) -> None:
        mgr = self.manager
        while self._waiting and len(self._running) < self.max_num_seqs:
            r = self._waiting[0]
            owed = sum(self._blocks(self._final_len(x)) - len(mgr.block_table(x.out.request_id))
                       for x in self._running)
            if mgr.num_free_blocks - owed < self._blocks(self._final_len(r)):
                break
            self._waiting.popleft()
            r.computed = mgr.add_sequence(r.out.request_id, r.out.prompt)
            self.stats["prefix_tokens_reused"] += r.computed
            self.stats["joined_after_finish"] += bool(self.finished)
            self._running.append(r)
        self.stats["max_running"] = max(self.stats["max_running"], len(self._running))

    def _schedule(self) -> list[tuple[_Request, int]]:
        budget, batch = self.max_step_tokens, []
        decoding = [r for r in self._running if r.computed >= len(r.out.prompt)]
        prefilling = [r for r in self._running if r.computed < len(r.out.prompt)]
        for r in decoding:
            batch.append((r, 1))
            budget -= 1
        for r in prefilling:
            if budget == 0:
                break
            n = min(len(r.out.prompt) - r.computed, budget)
            self.stats["chunked_prompts"] += r.computed + n < len(r.out.prompt) and r.computed == 0
            batch.append((r, n))
            budget -= n
        return batch

    def _sample(self, r: _Request, row: torch.Tensor) -> bool:
        """Greedy next token for ``r``; returns True (and frees it) if ``r`` finished."""
        tok = int(torch.argmax(row))
        r.out.tokens.append(tok)
        if r.out.logits is not None:
            r.out.logits.append(row.detach().float().numpy().copy())
        eos = r.eos_token_id is not None and tok == r.eos_token_id
        if not eos and len(r.out.tokens) < r.max_new_tokens:
            return False
        r.out.finish_reason = "eos" if eos else "length"
        self._running.remove(r)
        self.manager.free(r.out.request_id)
        self.finished[r.out.request_id] = r.out
        return True

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.manager.block_size)

    @staticmethod
    def _final_len(r: _Request) -> int:
        return len(r.out.prompt) + r.max_new_tokens - 1


def generate(model: Any, prompts: Sequence[Iterable[int]], max_new_tokens: int | Sequence[int], *,
             eos_token_id: int | None = None, **generator_kwargs: Any) -> list[GenerationOutput]:
    """Greedy-generate for every prompt with a :class:`PagedGenerator`; outputs in prompt order.

    ``max_new_tokens`` is one int or one per prompt; ``generator_kwargs`` go to PagedGenerator
    (``num_blocks`` is required; ``mixed_precision`` defaults to False: tokens as eager).
    """
    gen = PagedGenerator(model, **generator_kwargs)
    counts = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(counts) != len(prompts):
        fail("max_new_tokens", f"be an int or have {len(prompts)} entries (one per prompt)",
             f"{len(counts)} entries")
    ids = [gen.add_request(p, n, eos_token_id=eos_token_id) for p, n in zip(prompts, counts)]
    done = gen.run()
    return [done[i] for i in ids]
