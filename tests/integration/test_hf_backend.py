"""transformers models on the ``nki_paged`` attention backend (host.serving.hf_backend) driven by the
continuous-batching generator (host.serving.generation), against the same weights with transformers'
eager attention.

Tiny random models (2 layers, 4 query / 2 KV heads, head size 16, vocabulary 128, seeded).
Llama (dense kernel) and Qwen2 (default scheduled kernel): six prompts of 2-33 tokens, 32-40
greedy tokens each, at most 3 running at once, 16 tokens per step (chunked prefill), block size
8, two prompts sharing a 16-token prefix. Mistral, Gemma 2 and GPT-OSS: their attention variants
(sliding window, soft-cap, sinks) through the scheduled kernel. fp32 throughout
(mixed_precision=False) so greedy tokens must match exactly; logits within the "hf-logits"
tolerance of tests/conftest.py.

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

import host.serving.hf_backend as hf  # noqa: E402
from host.serving.generation import PagedGenerator, generate  # noqa: E402

pytestmark = pytest.mark.simulation

hf.register()

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=256, initializer_range=0.15, eos_token_id=None,
             bos_token_id=None, pad_token_id=None)
CONFIGS = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}
MAX_NEW = [32, 36, 32, 40, 33, 34]


def build_models(name, seed=0, cfg=None):
    """(eager, paged) models with identical seeded weights (``cfg`` overrides CONFIGS[name])."""
    cfg = CONFIGS[name](**SMALL) if cfg is None else cfg
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


# ----------------------------------------------------------------------------- variant models

# model -> (config, {variant: config change that turns it off})
VARIANTS = {
    "mistral": (lambda: transformers.MistralConfig(**SMALL, sliding_window=8),
                {"sliding_window": dict(sliding_window=None)}),
    "gemma2": (lambda: transformers.Gemma2Config(**SMALL, sliding_window=8,
                                                 attn_logit_softcapping=1.0,
                                                 final_logit_softcapping=30.0,
                                                 query_pre_attn_scalar=16),
               {"sliding_window": dict(sliding_window=4096),
                "logits_soft_cap": dict(attn_logit_softcapping=None)}),
    "gpt_oss": (lambda: transformers.GptOssConfig(**SMALL, sliding_window=8, num_local_experts=2,
                                                  num_experts_per_tok=1),
                {"sliding_window": dict(sliding_window=4096), "sinks": None}),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_models_match_eager_attention(name, tol):
    """Mistral (sliding window on every layer), Gemma 2 (attention logit soft-cap, query scale,
    sliding window on alternate layers) and GPT-OSS (attention sinks, sliding window on alternate
    layers): 32 greedy tokens for a 5- and a 20-token prompt (windows of 8 are exceeded), chunked
    prefill, block size 4. Controls: switching each variant off in the eager model moves its
    logits by more than 100x the tolerance, so the backend must apply every one of them."""
    make_cfg, switches = VARIANTS[name]
    eager, paged = build_models(name, cfg=make_cfg())
    rng = np.random.default_rng(5)
    ps = [rng.integers(0, 128, n).tolist() for n in (5, 20)]
    gen = PagedGenerator(paged, num_blocks=32, block_size=4, max_num_seqs=2, max_step_tokens=8,
                         mixed_precision=False, large_tile_size=512, record_logits=True)
    outs = [gen.run()[i] for i in [gen.add_request(p, 32) for p in ps]]
    atol, rtol = tol("hf-logits", "float32")
    rows = [eager_logits(eager, p, out.tokens) for p, out in zip(ps, outs)]
    for out, ref in zip(outs, rows):
        assert out.tokens == ref.argmax(-1).tolist() and len(out.tokens) == 32
        np.testing.assert_allclose(np.stack(out.logits), ref, atol=atol, rtol=rtol)
    for variant, change in switches.items():
        if change is None:                                   # sinks: a no-op sink logit
            off = copy.deepcopy(eager)
            with torch.no_grad():
                for layer in off.model.layers:
                    layer.self_attn.sinks.fill_(-1e9)
        else:
            cfg = make_cfg()
            for k, v in change.items():
                setattr(cfg, k, v)
            off = build_models(name, cfg=cfg)[0]
            off.load_state_dict(eager.state_dict())
        moved = np.abs(eager_logits(off, ps[1], outs[1].tokens) - rows[1]).max()
        assert moved > 100 * atol, f"{name}: switching {variant} off changes nothing"


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
    table = torch.tensor([[2, 0]], dtype=torch.int32)               # positions 0-7, 8-15
    pos = torch.arange(ctx, ctx + T)
    meta = hf.PagedBatch(kv_caches=caches, slot_mapping=table[0, pos // 8].long() * 8 + pos % 8,
                         block_tables=table,
                         query_lens=torch.tensor([T]), context_lens=torch.tensor([ctx]),
                         mixed_precision=False, large_tile_size=512)
    q = torch.rand((1, 4, T, 16), generator=g)
    k, v = torch.rand((1, 2, T, 16), generator=g), torch.rand((1, 2, T, 16), generator=g)
    return meta, q, k, v


def test_variant_options_reach_the_host_and_an_inert_window_is_dropped(monkeypatch):
    import functools

    import host.serving.torch_ops

    seen, real = [], host.serving.torch_ops.step_plan

    @functools.wraps(real)
    def spy(*a, **kw):
        seen.append({k: kw.get(k) for k in ("sliding_window", "logits_soft_cap", "sinks")})
        return real(*a, **kw)

    monkeypatch.setattr(host.serving.torch_ops, "step_plan", spy)
    meta, q, k, v = _one_sequence_batch()
    assert meta.max_seq_len == 10
    plain, _ = hf.paged_attention_forward(_Layer(), q, k, v, None, nki_paged=meta)
    inert, _ = hf.paged_attention_forward(_Layer(), q, k, v, None, nki_paged=meta,
                                          sliding_window=10)
    assert torch.equal(plain, inert) and plain.shape == (1, 6, 4, 16)
    sinks = torch.zeros(4)
    hf.paged_attention_forward(_Layer(), q, k, v, None, nki_paged=meta, sliding_window=9,
                               softcap=3.0, s_aux=sinks)
    none = dict(sliding_window=None, logits_soft_cap=None, sinks=None)
    assert seen[:2] == [none, none]
    assert seen[2]["sliding_window"] == 9 and seen[2]["logits_soft_cap"] == 3.0
    assert seen[2]["sinks"] is not None


def test_fp8_cache_is_written_and_read_with_its_scales(tol):
    """A PagedBatch over a float8_e4m3fn cache: the layer's new K/V are quantized into the cache
    with k_scale / v_scale, and attention reads the context through the same scales (float64
    reference on the cache as written)."""
    from host import paged_attention_ref
    from host._arrays import to_numpy

    meta, q, k, v = _one_sequence_batch()
    k_scale, v_scale = torch.tensor([0.01, 0.02]), torch.tensor(0.015)
    caches = (meta.kv_caches * 2 - 1).to(torch.float8_e4m3fn)     # context: arbitrary fp8 bytes
    before = caches.clone()
    meta = hf.PagedBatch(kv_caches=caches, slot_mapping=meta.slot_mapping,
                         block_tables=meta.block_tables, query_lens=meta.query_lens,
                         context_lens=meta.context_lens, mixed_precision=False,
                         large_tile_size=512, k_scale=k_scale, v_scale=v_scale)
    out, _ = hf.paged_attention_forward(_Layer(), q, k, v, None, nki_paged=meta)
    written = to_numpy(caches[0], "kv_cache")[0]
    slots = meta.slot_mapping.numpy()
    k_back = written[0, slots // 8, :, slots % 8].astype(np.float32) * k_scale.numpy()[:, None]
    np.testing.assert_allclose(k_back, hf.to_flat_tokens(k).numpy(), rtol=2 ** -4, atol=1e-3)
    ctx = meta.block_tables[0, 0].item()                       # context slots 0..3: block 2
    assert torch.equal(caches[0, :, ctx, :, :4].view(torch.uint8),
                       before[0, :, ctx, :, :4].view(torch.uint8))
    ref = paged_attention_ref(hf.to_flat_tokens(q).numpy(), hf.to_flat_tokens(k).numpy(),
                              hf.to_flat_tokens(v).numpy(), written, meta.block_tables.numpy(),
                              [6], [4], k_scale=k_scale.numpy(), v_scale=v_scale.numpy())
    np.testing.assert_allclose(out[0].numpy(), ref, atol=tol("fp32", "float32")[0])


def test_backend_rejects_what_it_cannot_honour():
    meta, q, k, v = _one_sequence_batch()
    with pytest.raises(ValueError, match="nki_paged must be a host.serving.hf_backend.PagedBatch"):
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
