"""transformers models on the ``nki_paged`` attention backend (host.hf_backend) driven by the
continuous-batching generator (host.generation), against the same weights with transformers'
eager attention.

Tiny random models (2 layers, 4 query / 2 KV heads, head size 16, vocabulary 128, seeded): six
prompts of 2-33 tokens, 32-40 greedy tokens each, at most 3 running at once, 16 tokens per step
(chunked prefill), block size 8, two prompts sharing a 16-token prefix. Llama runs the dense
kernel, Qwen2 the default (scheduled) one. fp32 throughout (mixed_precision=False) so greedy
tokens must match exactly; logits within the "hf-logits" tolerance of tests/conftest.py.

The eager reference is teacher-forced: one eager forward over prompt + generated tokens gives
the logits after every prefix (causal attention). If their argmax equals the generated tokens
at every step, eager greedy decoding produces exactly these tokens (induction on the step), so
this checks greedy equality with one forward per sequence instead of one per token.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import host.hf_backend as hf  # noqa: E402
from host.generation import PagedGenerator, generate  # noqa: E402

pytestmark = pytest.mark.simulation

hf.register()

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=256, initializer_range=0.15, eos_token_id=None,
             bos_token_id=None, pad_token_id=None)
CONFIGS = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}
MAX_NEW = [32, 36, 32, 40, 33, 34]


def build_models(name, seed=0):
    """(eager, paged) models with identical seeded weights."""
    cfg = CONFIGS[name](**SMALL)
    torch.manual_seed(seed)
    eager = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg),
                                                          attn_implementation="eager").eval()
    paged = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg),
                                                          attn_implementation=hf.ATTN_IMPLEMENTATION)
    paged.load_state_dict(eager.state_dict())
    return eager, paged.eval()


def prompts(seed=0):
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 128, 16).tolist()
    return [rng.integers(0, 128, n).tolist() for n in (5, 33, 2, 12)] + [shared + [1, 2, 3],
                                                                        shared + [7]]


def eager_logits(model, prompt, tokens):
    """(len(tokens), vocab) eager logits after prompt + tokens[:i], i = 0 .. len(tokens) - 1."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0]
    return logits[len(prompt) - 1:].numpy()


def eager_greedy(model, prompt, n):
    """Greedy decoding with transformers' eager attention and its DynamicCache."""
    cache = transformers.DynamicCache(config=model.config)
    ids, toks = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(n):
            toks.append(int(model(input_ids=ids, cache=cache, use_cache=True).logits[0, -1].argmax()))
            ids = torch.tensor([[toks[-1]]])
    return toks


@pytest.fixture(scope="module", params=[("llama", "dense"), ("qwen2", None)],
                ids=["llama-dense", "qwen2-default"])
def run(request):
    name, kernel = request.param
    eager, paged = build_models(name)
    ps = prompts()
    gen = PagedGenerator(paged, num_blocks=28, block_size=8, max_num_seqs=3, max_step_tokens=16,
                         mixed_precision=False, large_tile_size=512, kernel=kernel,
                         record_logits=True)
    ids = [gen.add_request(p, n) for p, n in zip(ps, MAX_NEW)]
    done = gen.run()
    outs = [done[i] for i in ids]
    refs = [eager_logits(eager, p, o.tokens) for p, o in zip(ps, outs)]
    return dict(name=name, gen=gen, outs=outs, refs=refs, eager=eager, prompts=ps)


def test_greedy_tokens_match_eager_attention(run):
    for out, n, rows in zip(run["outs"], MAX_NEW, run["refs"]):
        assert len(out.tokens) == n >= 32 and out.finish_reason == "length"
        assert out.tokens == rows.argmax(-1).tolist(), f"{run['name']} request {out.request_id}"


def test_logits_match_eager_attention(run, tol):
    atol, rtol = tol("hf-logits", "float32")
    for out, rows in zip(run["outs"], run["refs"]):
        np.testing.assert_allclose(np.stack(out.logits), rows, atol=atol, rtol=rtol)


def test_the_run_exercises_continuous_batching(run):
    s, mgr = run["gen"].stats, run["gen"].manager
    assert s["max_running"] == 3                # more prompts than slots: requests waited
    assert s["joined_after_finish"] >= 3        # ... and joined when others finished
    assert s["chunked_prompts"] >= 1            # a 33-token prompt in 16-token chunks
    assert s["mixed_steps"] >= 1                # prefill chunks and decodes in one forward
    assert s["prefix_tokens_reused"] == 16      # the shared 16-token prefix: 2 blocks of 8
    assert mgr.num_free_blocks == mgr.num_blocks and not mgr.sequences


def test_context_matters_in_these_models(run, tol):
    """Dropping the first half of a prompt moves the last logits far beyond the tolerance, so
    the equivalence above depends on attending to the paged context correctly."""
    p = run["prompts"][1]
    with torch.no_grad():
        full = run["eager"](input_ids=torch.tensor([p])).logits[0, -1]
        half = run["eager"](input_ids=torch.tensor([p[16:]])).logits[0, -1]
    assert float((full - half).abs().max()) > 100 * tol("hf-logits", "float32")[0]


# ----------------------------------------------------------------------------- backend pieces


def test_flat_token_layout_round_trip():
    x = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(1, 2, 5, 3)      # (1, H, T, d)
    flat = hf.to_flat_tokens(x)
    assert flat.shape == (5, 2, 3) and flat[4, 1, 2] == x[0, 1, 4, 2]
    assert torch.equal(hf.from_flat_tokens(flat).transpose(1, 2), x)        # (1, T, H, d)
    with pytest.raises(ValueError, match="flat batch of one row"):
        hf.to_flat_tokens(torch.zeros(2, 2, 5, 3))


class _Layer:
    layer_idx = 0


def _one_sequence_batch(T=6, ctx=4):
    g = torch.Generator().manual_seed(3)
    caches = torch.rand((1, 2, 4, 2, 8, 16), generator=g)
    meta = hf.PagedBatch(kv_caches=caches, slot_mapping=torch.arange(ctx, ctx + T),
                         block_tables=torch.tensor([[2, 0]], dtype=torch.int32),
                         query_lens=torch.tensor([T]), context_lens=torch.tensor([ctx]),
                         mixed_precision=False, large_tile_size=512)
    q = torch.rand((1, 4, T, 16), generator=g)
    k, v = torch.rand((1, 2, T, 16), generator=g), torch.rand((1, 2, T, 16), generator=g)
    return meta, q, k, v


def test_inert_sliding_window_is_dropped_and_others_reach_the_host():
    meta, q, k, v = _one_sequence_batch()
    assert meta.max_seq_len == 10
    plain, _ = hf.paged_attention_forward(_Layer(), q, k, v, None, nki_paged=meta)
    inert, _ = hf.paged_attention_forward(_Layer(), q, k, v, None, nki_paged=meta,
                                          sliding_window=10)
    assert torch.equal(plain, inert) and plain.shape == (1, 6, 4, 16)
    import inspect

    from host.attention import paged_attention as host_fn

    supported = inspect.signature(host_fn).parameters
    for kw, host_kw in (("sliding_window", "sliding_window"), ("softcap", "logits_soft_cap"),
                        ("s_aux", "sinks")):
        if host_kw in supported:
            continue      # numerics of supported variants are tested against eager models
        value = torch.zeros(4) if kw == "s_aux" else 3
        with pytest.raises(NotImplementedError, match=host_kw):
            hf.paged_attention_forward(_Layer(), q, k, v, None, nki_paged=meta, **{kw: value})


def test_backend_rejects_what_it_cannot_honour():
    meta, q, k, v = _one_sequence_batch()
    with pytest.raises(ValueError, match="nki_paged must be a host.hf_backend.PagedBatch"):
        hf.paged_attention_forward(_Layer(), q, k, v, None)
    with pytest.raises(NotImplementedError, match="dropout"):
        hf.paged_attention_forward(_Layer(), q, k, v, None, dropout=0.1, nki_paged=meta)
    with pytest.raises(NotImplementedError, match="attention mask"):
        hf.paged_attention_forward(_Layer(), q, k, v, torch.ones(1, 1, 6, 10), nki_paged=meta)
    with pytest.raises(ValueError, match="kv_caches must have shape"):
        hf.PagedBatch(kv_caches=torch.zeros(2, 4, 2, 8, 16), slot_mapping=torch.arange(1),
                      block_tables=torch.zeros(1, 1, dtype=torch.int32),
                      query_lens=torch.tensor([1]), context_lens=torch.tensor([0]))


def test_generator_checks_model_and_requests():
    eager, paged = build_models("llama")
    with pytest.raises(ValueError, match="model must use attn_implementation='nki_paged'"):
        PagedGenerator(eager, num_blocks=8)
    gen = PagedGenerator(paged, num_blocks=4, block_size=8, max_num_seqs=2)
    with pytest.raises(ValueError, match="prompt must fit the cache"):
        gen.add_request(list(range(20)), 14)      # 33 cached tokens > 4 blocks of 8
    with pytest.raises(ValueError, match="prompt must hold at least one token"):
        gen.add_request([], 3)
    with pytest.raises(ValueError, match="max_step_tokens must be >= 2"):
        PagedGenerator(paged, num_blocks=8, max_num_seqs=2, max_step_tokens=1)


def test_generate_stops_at_eos():
    eager, paged = build_models("qwen2", seed=1)
    p = prompts(1)[0]
    toks = eager_greedy(eager, p, 6)
    eos = toks[4]
    stop = toks.index(eos) + 1
    (out,) = generate(paged, [p], 12, eos_token_id=eos, num_blocks=8, block_size=8,
                      mixed_precision=False, large_tile_size=512)
    assert out.finish_reason == "eos" and out.tokens == toks[:stop] and out.logits is None
