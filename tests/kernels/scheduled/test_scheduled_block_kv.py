"""vLLM's block-KV layout ((N, B, Hkv, d) key and value caches, block 0 the null block) in the
scheduled paged-attention kernel, on both NKI APIs (legacy on trn1, the current API on trn2):
numerics against the float64 reference, garbage safety, zero-copy launches and the DMA
descriptors the layout costs.

The reference reads a fused (2, N, Hkv, B, d) cache; the tests build it and the pair from the
same random values with their own transpositions (no host layout code)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.attention import paged_attention, run_paged_attention
from host.reference import paged_attention_ref
from host.step_plan import plan_paged_attention

pytestmark = [pytest.mark.simulation,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
BF16 = np.dtype(ml_dtypes.bfloat16)
# (api, simulator target): the API each target's users get
API_TARGETS = [("legacy", "trn1"), ("nki", "trn2")]
API_IDS = ["legacy-trn1", "nki-trn2"]


def vllm_batch(seed, query_lens, context_lens, *, H, Hkv, d, B, dtype=np.float32, spare=2):
    """Random batch whose block tables never name block 0 (vllm-neuron's null block): returns
    (query, key, value, fused (2, N, Hkv, B, d), pair of (N, B, Hkv, d) views of one
    (2, N, B, Hkv, d) buffer, block_tables (unused entries -1), query_lens, context_lens)."""
    rng = np.random.default_rng(seed)
    q, c = np.asarray(query_lens), np.asarray(context_lens)
    nblk = -(-c // B)
    N = 1 + int(nblk.sum()) + spare
    perm = 1 + rng.permutation(N - 1)
    bt = np.full((len(q), int(nblk.max()) + 1), -1, np.int32)
    off = 0
    for i, n in enumerate(nblk.tolist()):
        bt[i, :n] = perm[off:off + n]
        off += n
    u = lambda *s: rng.uniform(-1, 1, size=s).astype(np.float32).astype(dtype)  # noqa: E731
    T = int(q.sum())
    vllm = u(2, N, B, Hkv, d)                      # vLLM's per-layer tensor, then unbind(0)
    fused = np.ascontiguousarray(vllm.transpose(0, 1, 3, 2, 4))
    return u(T, H, d), u(T, Hkv, d), u(T, Hkv, d), fused, (vllm[0], vllm[1]), bt, q, c


def _check(out, ref, tol, dtype, mixed=True):
    atol, rtol = tol("mixed" if mixed else "fp32", dtype)
    err = np.abs(np.asarray(out, np.float64) - ref)
    assert np.all(err <= atol + rtol * np.abs(ref)), float(err.max())


CASES = {   # name: (query_lens, context_lens, H, Hkv, d, B, dtype, options)
    "decode_gqa": ([1] * 6, [1, 17, 200, 511, 513, 1400], 8, 2, 64, 16, np.float32, {}),
    "prefill": ([300, 129], [0, 50], 4, 4, 32, 32, np.float32, {}),
    "mixed_bf16_d128": ([1, 3, 150, 1], [700, 40, 300, 1500], 8, 2, 128, 16, BF16, {}),
    "sliding_window": ([1, 3, 150, 1], [700, 40, 300, 1500], 4, 2, 64, 32, np.float32,
                       dict(sliding_window=300)),
    "mqa": ([1, 70, 1], [900, 30, 64], 4, 1, 64, 16, np.float32, {}),
    "d256_fp32": ([1, 40, 1], [600, 100, 33], 4, 2, 256, 16, np.float32,
                  dict(mixed_precision=False)),
}


@pytest.mark.parametrize("api, target", API_TARGETS, ids=API_IDS)
@pytest.mark.parametrize("name", list(CASES))
def test_block_kv_pair_matches_the_reference(name, api, target, tol):
    q_lens, c_lens, H, Hkv, d, B, dt, opts = CASES[name]
    seed = 10 + list(CASES).index(name)
    query, key, value, fused, pair, bt, q, c = vllm_batch(seed, q_lens, c_lens, H=H, Hkv=Hkv,
                                                          d=d, B=B, dtype=dt)
    ref_opts = {k: v for k, v in opts.items() if k != "mixed_precision"}
    ref = paged_attention_ref(query, key, value, fused, bt, q, c, **ref_opts)
    with nki_sim.use_target(target):
        out = paged_attention(query, key, value, pair, bt, q, c, backend="sim",
                              large_tile_size=512, api=api, **opts)
    assert out.shape == ref.shape and out.dtype == query.dtype
    _check(out, ref, tol, dt, opts.get("mixed_precision", True))


@pytest.mark.parametrize("api, target", API_TARGETS, ids=API_IDS)
def test_a_plan_runs_every_layer_in_place_and_reads_the_cache_at_run_time(api, target, tol,
                                                                         monkeypatch):
    """plan_paged_attention(kv_layout="block_kv") once, run_paged_attention per layer: each
    launch gets the caller's key / value caches themselves (the same arrays, no copy), and a
    change to a layer's cache after planning shows in its output."""
    import host.attention as attention

    query, key, value, fused, pair, bt, q, c = vllm_batch(3, [1, 3, 150, 1], [700, 40, 300, 90],
                                                          H=4, Hkv=2, d=32, B=16)
    launched = []
    real = attention.launch_kernel

    def spy(kernel, args, kwargs, **kw):
        launched.append((args, kwargs))
        return real(kernel, args, kwargs, **kw)

    monkeypatch.setattr(attention, "launch_kernel", spy)
    with nki_sim.use_target(target):
        plan = plan_paged_attention(bt, q, c, num_heads=4, num_kv_heads=2, head_size=32,
                                    block_size=16, num_blocks=fused.shape[1], dtype=np.float32,
                                    large_tile_size=512, api=api, backend="sim",
                                    kv_layout="block_kv")
        other = tuple(np.ascontiguousarray(x[::-1]) for x in pair)    # a second layer's caches
        for layer in (pair, other):
            launched.clear()
            out = run_paged_attention(plan, query, key, value, layer)
            assert launched
            for args, kwargs in launched:
                # a class launch's cache is its third argument; a pair launch's (mixed batch)
                # follows both classes' seven per-class inputs
                kv = args[2] if len(args) == 9 else args[14]
                assert kv is layer[0] and kwargs["value_cache"] is layer[1]
            layer_fused = np.stack([x.transpose(0, 2, 1, 3) for x in layer])
            _check(out, paged_attention_ref(query, key, value, layer_fused, bt, q, c), tol,
                   np.float32)
        pair[0][bt[0, 2], 5] = 7.0                  # a visible key of sequence 0, after planning
        out = run_paged_attention(plan, query, key, value, pair)
    changed = np.stack([x.transpose(0, 2, 1, 3) for x in pair])
    _check(out, paged_attention_ref(query, key, value, changed, bt, q, c), tol, np.float32)
    assert not np.allclose(out[0], paged_attention_ref(query, key, value, fused, bt, q, c)[0],
                           atol=1e-2)


def _poison_unseen(pair, bt, c, B):
    """NaN in every slot no query may see: block 0 (the null block), the tail of each sequence's
    last block past its context, and every block no sequence names (both K and V)."""
    dirty = tuple(x.copy() for x in pair)
    used = {0}
    for i, ci in enumerate(c.tolist()):
        blocks = bt[i, :-(-ci // B)]
        used.update(blocks.tolist())
        if ci % B:
            for x in dirty:
                x[blocks[-1], ci % B:] = np.nan
    for x in dirty:
        x[0] = np.nan
        x[[k for k in range(x.shape[0]) if k not in used]] = np.nan
    return dirty


@pytest.mark.parametrize("api, target", API_TARGETS, ids=API_IDS)
@pytest.mark.parametrize("dt", [np.float32, BF16], ids=["fp32", "bf16"])
def test_garbage_no_query_may_see_never_reaches_any_output(api, target, dt):
    B = 16
    query, key, value, fused, pair, bt, q, c = vllm_batch(4, [1, 3, 40, 1, 150], [50, 7, 300, 33, 0],
                                                          H=4, Hkv=2, d=64 if dt is BF16 else 16,
                                                          B=B, dtype=dt, spare=3)
    with nki_sim.use_target(target):
        clean = paged_attention(query, key, value, pair, bt, q, c, backend="sim",
                                large_tile_size=512, api=api)
        dirty = _poison_unseen(pair, bt, c, B)
        assert np.isnan(dirty[0].astype(np.float32)).any()
        out = paged_attention(query, key, value, dirty, bt, q, c, backend="sim",
                              large_tile_size=512, api=api)
    assert np.isfinite(clean.astype(np.float32)).all()
    assert out.tobytes() == clean.tobytes()


@pytest.mark.parametrize("api, target", API_TARGETS, ids=API_IDS)
def test_nan_in_one_sequence_or_one_head_stays_there(api, target):
    """A block-KV row interleaves the heads of a token, and sequences own disjoint blocks: NaN in
    every cached key / value of sequence 0 reaches only sequence 0's outputs, and NaN in KV head
    1 of every block only the query heads of KV head 1 (the poison is seen where it may be)."""
    B, H, Hkv = 16, 4, 2
    query, key, value, fused, pair, bt, q, c = vllm_batch(5, [2, 3, 40, 1], [70, 7, 300, 33],
                                                          H=H, Hkv=Hkv, d=16, B=B)
    run = lambda kv: paged_attention(query, key, value, kv, bt, q, c, backend="sim",  # noqa: E731
                                     large_tile_size=512, api=api)
    with nki_sim.use_target(target):
        clean = run(pair)
        seq0 = tuple(x.copy() for x in pair)
        for x in seq0:
            x[bt[0, :-(-int(c[0]) // B)]] = np.nan
        out_seq = run(seq0)
        head1 = tuple(x.copy() for x in pair)
        for x in head1:
            x[:, :, 1] = np.nan
        out_head = run(head1)
    t0 = int(q[0])
    assert np.isnan(out_seq[:t0]).all()
    assert out_seq[t0:].tobytes() == clean[t0:].tobytes()
    G = H // Hkv
    assert np.isnan(out_head[:, G:]).all()
    assert out_head[:, :G].tobytes() == clean[:, :G].tobytes()


@pytest.mark.parametrize("api, target", API_TARGETS, ids=API_IDS)
@pytest.mark.parametrize("Hkv", [2, 1])
def test_only_the_cache_gathers_change_each_row_into_per_token_descriptors(api, target, Hkv):
    """Against the fused layout the instruction stream is the same; each gather of cache rows
    moves the same bytes, a row of b' tokens as b' descriptors of d elements (a head's tokens
    are Hkv * d apart) -- one descriptor per row again when Hkv = 1. Outputs are identical."""
    d = 32
    query, key, value, fused, pair, bt, q, c = vllm_batch(6, [1, 3, 150], [900, 40, 300], H=4,
                                                          Hkv=Hkv, d=d, B=32, dtype=BF16)
    runs = {}
    for name, kv in (("fused", fused), ("block_kv", pair)):
        with nki_sim.use_target(target), nki_sim.tracing() as trace:
            out = paged_attention(query, key, value, kv, bt, q, c, backend="sim",
                                  large_tile_size=2048, partial_tile_size=512, api=api)
        runs[name] = (out, [e for e in trace.events if e.engine == "dma"])
    (out_f, ev_f), (out_b, ev_b) = runs["fused"], runs["block_kv"]
    assert out_b.tobytes() == out_f.tobytes()
    assert [(e.op, e.bytes, e.skipped_rows) for e in ev_b] == \
        [(e.op, e.bytes, e.skipped_rows) for e in ev_f]
    split = 0
    for ef, eb in zip(ev_f, ev_b):
        if list(eb.descriptor_bytes) == list(ef.descriptor_bytes):
            continue
        assert Hkv > 1 and ef.dma_kind == "indirect"
        # every b'*d-element descriptor of the fused gather is b' descriptors of d elements
        assert set(eb.descriptor_bytes) == {d * 2}
        assert len(eb.descriptor_bytes) == sum(b // (d * 2) for b in ef.descriptor_bytes)
        split += 1
    assert split > 0 if Hkv > 1 else split == 0
