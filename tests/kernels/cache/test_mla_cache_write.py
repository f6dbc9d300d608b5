"""concat_and_cache_mla (host.cache.mla_cache) and its kernel nki_kernels.cache.mla_cache_update on the simulator.

Reference: a per-token loop written from the definition (entry kv_cache[s // B, s % B] gets
[kv_c[t] | k_pe[t]] in its first R + P elements), sharing no code with the host's row index.
Caches start filled with random bits everywhere, padding included, so a write to a padding
element or to a wrong entry changes bytes the comparison sees.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nki_sim
from host import allocate_mla_cache, concat_and_cache_mla, gather_mla_entries

pytestmark = pytest.mark.simulation

BF16 = ml_dtypes.bfloat16
DTYPES = [np.float32, BF16, np.float16]


def reference_write(kv_c, k_pe, cache, slots):
    """Expected cache after the write: per token, per definition; negative slots skipped."""
    out = cache.copy()
    B, R, P = cache.shape[1], kv_c.shape[1], k_pe.shape[1]
    for t, s in enumerate(np.asarray(slots).tolist()):
        if s < 0:
            continue
        out[s // B, s % B, :R] = kv_c[t].astype(cache.dtype)
        out[s // B, s % B, R:R + P] = k_pe[t].astype(cache.dtype)
    return out


def random_cache(rng, n_blocks, block_size, *, R=512, P=64, dtype=BF16, align=None):
    """allocate_mla_cache, then every element (padding too) set to random values."""
    cache = allocate_mla_cache(n_blocks, block_size, kv_lora_rank=R, qk_rope_head_dim=P, dtype=dtype,
                               entry_alignment_bytes=align)
    cache[...] = rng.standard_normal(cache.shape).astype(cache.dtype)
    return cache


def make_tokens(rng, n_tok, n_slots, *, R=512, P=64, dtype=BF16, n_negative=0):
    kv_c = rng.standard_normal((n_tok, R)).astype(dtype)
    k_pe = rng.standard_normal((n_tok, P)).astype(dtype)
    slots = rng.permutation(n_slots)[:n_tok].astype(np.int64)
    slots[:n_negative] = -1 - np.arange(n_negative)
    rng.shuffle(slots)
    return kv_c, k_pe, slots


def assert_same_bits(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes(), (
        f"{int(np.sum(actual.view(np.uint8) != expected.view(np.uint8)))} bytes differ")


# ----------------------------------------------------------------------------- must-pass


@pytest.mark.parametrize("target, api", [("trn1", "legacy"), ("trn2", "nki")])
@pytest.mark.parametrize("dtype", [BF16, np.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("align", [None, 256], ids=["unaligned", "aligned256"])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_write_matches_reference(rng, block_size, align, dtype, target, api):
    """DeepSeek dims (576 of 576 / 640 elements): 150 tokens = one 128-token tile + a tail."""
    n_blocks = -(-200 // block_size)
    cache = random_cache(rng, n_blocks, block_size, dtype=dtype, align=align)
    kv_c, k_pe, slots = make_tokens(rng, 150, n_blocks * block_size, dtype=dtype, n_negative=7)
    expected = reference_write(kv_c, k_pe, cache, slots)
    padding = cache[..., 576:].copy()
    with nki_sim.use_target(target):
        result = concat_and_cache_mla(kv_c, k_pe, cache, slots, api=api)
    assert result is cache
    assert_same_bits(cache, expected)
    assert_same_bits(cache[..., 576:], padding)                 # padding never written
    assert cache.shape[2] == (640 if align and dtype is BF16 else 576)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("kv_dtype", DTYPES, ids=lambda t: "kv_" + np.dtype(t).name)
def test_inputs_cast_to_cache_dtype(rng, dtype, kv_dtype):
    cache = random_cache(rng, 4, 8, R=24, P=8, dtype=dtype, align=128)
    kv_c, k_pe, slots = make_tokens(rng, 20, 32, R=24, P=8, dtype=kv_dtype, n_negative=2)
    expected = reference_write(kv_c, k_pe, cache, slots)
    concat_and_cache_mla(kv_c, k_pe, cache, slots)
    assert_same_bits(cache, expected)


def test_round_trip_with_gather_mla_entries(rng):
    """gather_mla_entries is the inverse of the write on the written slots; padding stays zero."""
    cache = allocate_mla_cache(6, 16, entry_alignment_bytes=256)            # bf16, 640
    kv_c, k_pe, slots = make_tokens(rng, 70, 96)
    concat_and_cache_mla(kv_c, k_pe, cache, slots)
    got_c, got_pe = gather_mla_entries(cache, slots)
    assert_same_bits(got_c, kv_c)
    assert_same_bits(got_pe, k_pe)
    assert not cache[..., 576:].astype(np.float32).any()
    unwritten = np.setdiff1d(np.arange(96), slots)
    assert not cache.reshape(96, 640)[unwritten].astype(np.float32).any()


def test_negative_slots_are_skipped_without_wrapping(rng):
    """Any negative slot writes nothing; the last slot (where -1 would wrap) keeps its own data."""
    cache = random_cache(rng, 3, 4, R=16, P=4, dtype=np.float32)
    kv_c, k_pe, _ = make_tokens(rng, 6, 12, R=16, P=4, dtype=np.float32)
    slots = np.array([-1, 0, -1, 11, -7, 5])
    expected = reference_write(kv_c, k_pe, cache, slots)
    concat_and_cache_mla(kv_c, k_pe, cache, slots)
    assert_same_bits(cache, expected)
    np.testing.assert_array_equal(cache[2, 3, :16], kv_c[3])


def test_all_negative_and_zero_tokens_are_no_ops(rng):
    cache = random_cache(rng, 2, 4, R=8, P=4, dtype=np.float32)
    before = cache.tobytes()
    kv_c, k_pe, _ = make_tokens(rng, 3, 8, R=8, P=4, dtype=np.float32)
    concat_and_cache_mla(kv_c, k_pe, cache, np.full(3, -1))
    concat_and_cache_mla(kv_c[:0], k_pe[:0], cache, np.zeros(0, np.int64))
    assert cache.tobytes() == before


@pytest.mark.parametrize("api", ["legacy", "nki"])
def test_several_chunks_and_a_tail(rng, monkeypatch, api):
    """A tiny chunk budget: 2 tiles per chunk, 5 full tiles (2 + 2 + 1) plus a 9-token tail."""
    import nki_kernels.cache.mla_cache_update as mod

    monkeypatch.setattr(mod, "CHUNK_BUDGET_BYTES", 2 * (12 * 4 + 4))
    cache = random_cache(rng, 200, 4, R=8, P=4, dtype=np.float32)
    kv_c, k_pe, slots = make_tokens(rng, 5 * 128 + 9, 800, R=8, P=4, dtype=np.float32, n_negative=20)
    expected = reference_write(kv_c, k_pe, cache, slots)
    concat_and_cache_mla(kv_c, k_pe, cache, slots, api=api)
    assert_same_bits(cache, expected)


def test_torch_cache_updated_in_place(rng):
    torch = pytest.importorskip("torch")
    cache = torch.zeros((4, 16, 640), dtype=torch.bfloat16)
    kv_c = torch.from_numpy(rng.standard_normal((10, 512)).astype(np.float32))
    k_pe = torch.from_numpy(rng.standard_normal((10, 64)).astype(np.float32))
    slots = torch.from_numpy(rng.permutation(64)[:10])
    assert concat_and_cache_mla(kv_c, k_pe, cache, slots) is cache
    s = slots.numpy()
    got = cache.float().numpy()
    np.testing.assert_array_equal(got[s // 16, s % 16, :512], kv_c.numpy().astype(BF16).astype(np.float32))
    np.testing.assert_array_equal(got[s // 16, s % 16, 512:576], k_pe.numpy().astype(BF16).astype(np.float32))
    assert not got[..., 576:].any()


@pytest.mark.parametrize("target, api", [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")])
def test_floor_sdk_with_traced_loop_checks(rng, monkeypatch, target, api):
    """The oldest toolchain the kernel claims (legacy SDK 2.23: dma_copy oob_mode, Python control
    flow on traced loop variables as errors; current NKI 0.6), several chunks and a tail."""
    import warnings

    from nki_sim.current import use_nki_version

    import nki_kernels.cache.mla_cache_update as mod

    monkeypatch.setattr(mod, "CHUNK_BUDGET_BYTES", 2 * (12 * 4 + 4))
    cache = random_cache(rng, 150, 4, R=8, P=4, dtype=np.float32)
    kv_c, k_pe, slots = make_tokens(rng, 4 * 128 + 30, 600, R=8, P=4, dtype=np.float32, n_negative=3)
    expected = reference_write(kv_c, k_pe, cache, slots)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        floor = (nki_sim.configure(sdk="2.23", traced_loops="error") if api == "legacy"
                 else use_nki_version("0.6"))
        with floor, nki_sim.use_target(target):
            concat_and_cache_mla(kv_c, k_pe, cache, slots, api=api)
    assert_same_bits(cache, expected)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_shapes_match_reference(data):
    """Random R, P, alignment, B, N, T, padding slots, dtypes and chunk budgets."""
    import nki_kernels.cache.mla_cache_update as mod

    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    R = data.draw(st.integers(1, 40), label="R")
    P = data.draw(st.integers(1, 12), label="P")
    align = data.draw(st.sampled_from([None, 2, 32, 64, 256]), label="align")
    B = data.draw(st.sampled_from([1, 2, 4, 16]), label="B")
    N = data.draw(st.integers(1, 40), label="N")
    T = data.draw(st.integers(0, min(N * B, 300)), label="T")
    neg = data.draw(st.integers(0, T), label="negatives")
    dtype = data.draw(st.sampled_from(DTYPES), label="cache dtype")
    kv_dtype = data.draw(st.sampled_from(DTYPES), label="kv dtype")
    budget = data.draw(st.sampled_from([None, 1, 500]), label="chunk budget")
    cache = random_cache(rng, N, B, R=R, P=P, dtype=dtype, align=align)
    kv_c, k_pe, slots = make_tokens(rng, T, N * B, R=R, P=P, dtype=kv_dtype, n_negative=neg)
    expected = reference_write(kv_c, k_pe, cache, slots)
    with pytest.MonkeyPatch.context() as mp:
        if budget is not None:
            mp.setattr(mod, "CHUNK_BUDGET_BYTES", budget)
        concat_and_cache_mla(kv_c, k_pe, cache, slots)
    assert_same_bits(cache, expected)


def test_cache_written_by_the_kernel_feeds_the_reference(rng):
    """End to end in the MLA convention: every token of every sequence (the new ones included) is
    written with concat_and_cache_mla, then mla_paged_attention_ref on the cache equals causal
    attention computed here directly on the token arrays (no cache, no block table)."""
    from host import mla_paged_attention_ref

    R, P, H, B = 512, 64, 4, 16
    qlens, clens = [4, 1, 1], [20, 7, 33]
    nblk = [-(-c // B) for c in clens]
    n_blocks = sum(nblk) + 2
    perm = rng.permutation(n_blocks)
    bt = np.full((3, max(nblk)), -1, np.int64)
    tokens, slots, off = [], [], 0
    for i, c in enumerate(clens):
        bt[i, :nblk[i]] = perm[off:off + nblk[i]]
        off += nblk[i]
        tokens.append((rng.standard_normal((c, R)).astype(BF16), rng.standard_normal((c, P)).astype(BF16)))
        slots.append(bt[i, np.arange(c) // B] * B + np.arange(c) % B)
    cache = allocate_mla_cache(n_blocks, B, entry_alignment_bytes=256)
    concat_and_cache_mla(np.concatenate([t[0] for t in tokens] + [tokens[0][0][:3]]),
                         np.concatenate([t[1] for t in tokens] + [tokens[0][1][:3]]), cache,
                         np.concatenate(slots + [np.full(3, -1)]))              # + 3 padding tokens
    q = rng.standard_normal((sum(qlens), H, R + P)).astype(BF16)
    out = mla_paged_attention_ref(q, cache, bt, qlens, clens)

    scale, t0 = 1 / math.sqrt(R + P), 0
    for (kv_c, k_pe), n, c in zip(tokens, qlens, clens):
        keys = np.concatenate([kv_c, k_pe], axis=1).astype(np.float64)
        for a in range(n):
            pos = c - n + a
            s = scale * q[t0 + a].astype(np.float64) @ keys[:pos + 1].T       # (H, pos + 1)
            w = np.exp(s - s.max(axis=1, keepdims=True))
            want = (w / w.sum(axis=1, keepdims=True)) @ kv_c[:pos + 1].astype(np.float64)
            np.testing.assert_allclose(out[t0 + a], want, rtol=1e-10, atol=1e-12)
        t0 += n


# ----------------------------------------------------------------------------- must-fail (host)


def _bad_inputs(rng):
    cache = random_cache(rng, 2, 4, R=8, P=4, dtype=np.float32, align=64)     # E = 16
    kv_c, k_pe, slots = make_tokens(rng, 3, 8, R=8, P=4, dtype=np.float32)
    f = np.float32
    read_only = cache.copy()
    read_only.setflags(write=False)
    return [
        ("kv_c", dict(kv_c=kv_c.astype(np.int32))),                        # not floating
        ("kv_c", dict(kv_c=kv_c[0])),                                       # not 2-D
        ("kv_c", dict(kv_c=np.zeros((3, 0), f))),                           # R = 0
        ("k_pe", dict(k_pe=k_pe[:2])),                                      # T mismatch
        ("k_pe", dict(k_pe=k_pe[:, None])),                                 # not 2-D
        ("k_pe", dict(k_pe=np.zeros((3, 0), f))),                           # P = 0
        ("kv_cache", dict(kv_c=np.zeros((3, 13), f))),                      # R + P = 17 > E = 16
        ("kv_cache", dict(cache=np.zeros((2, 2, 1, 4, 16), f))),            # paged K/V layout, not MLA
        ("kv_cache", dict(cache=cache.astype(np.int16))),                   # dtype
        ("kv_cache", dict(cache=np.asfortranarray(cache))),                 # not C-contiguous
        ("kv_cache", dict(cache=read_only)),                                # read-only
        ("kv_cache", dict(cache=[[[0.0] * 16] * 4] * 2)),                   # not an array
        ("slot_mapping", dict(slots=slots[:2])),                            # length
        ("slot_mapping", dict(slots=slots.astype(np.float32))),             # not integer
        ("slot_mapping", dict(slots=slots.reshape(3, 1))),                  # not 1-D
        ("slot_mapping", dict(slots=np.array([0, 8, 3]))),                  # = N * B
        ("slot_mapping", dict(slots=np.array([0, 10**9, 3]))),              # far out of range
        ("slot_mapping", dict(slots=np.array([3, 2**64 - 1, 1], np.uint64))),   # must not wrap to -1
        ("slot_mapping", dict(slots=np.array([5, -1, 5]))),                 # duplicate
    ], (kv_c, k_pe, cache, slots)


@pytest.mark.parametrize("i", range(19))
def test_bad_inputs_rejected_before_writing(rng, i):
    cases, (kv_c, k_pe, cache, slots) = _bad_inputs(rng)
    assert len(cases) == 19
    arg, override = cases[i]
    c = override.get("cache", cache)
    before = np.asarray(c).tobytes()
    with pytest.raises(ValueError, match=r"^" + arg):
        concat_and_cache_mla(override.get("kv_c", kv_c), override.get("k_pe", k_pe), c,
                             override.get("slots", slots))
    assert np.asarray(c).tobytes() == before


def test_messages_name_constraint_and_value(rng):
    cases, (kv_c, k_pe, cache, slots) = _bad_inputs(rng)
    with pytest.raises(ValueError, match=r"kv_lora_rank \+ qk_rope_head_dim = 17 .*entry size 16"):
        concat_and_cache_mla(np.zeros((3, 13), np.float32), k_pe, cache, slots)
    with pytest.raises(ValueError, match=r"slot_mapping must not repeat .*\[5\]"):
        concat_and_cache_mla(kv_c, k_pe, cache, np.array([5, -1, 5]))
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 8"):
        concat_and_cache_mla(kv_c, k_pe, cache, np.array([0, 8, 3]))


def test_fp8_cache_not_supported(rng):
    cache = np.zeros((2, 4, 16), ml_dtypes.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="float8"):
        concat_and_cache_mla(np.zeros((1, 8), np.float32), np.zeros((1, 4), np.float32), cache, np.array([0]))
    assert not cache.astype(np.float32).any()


# ----------------------------------------------------------------------------- trace


def dma_events(trace):
    return [e for e in trace.events if e.engine == "dma"]


@pytest.mark.parametrize("n_tok,n_neg,align", [(1, 0, None), (128, 0, 256), (150, 7, 256), (300, 40, None)])
def test_dma_counts_one_store_per_128_tokens(one_core, rng, n_tok, n_neg, align):
    """ceil(T / 128) indirect stores, one descriptor of (R + P) * 2 bytes per valid token (the
    padding is never part of a store), padding rows skipped; 3 loads per chunk + 4 for a tail."""
    n_blocks = -(-n_tok // 16) + 1
    cache = random_cache(rng, n_blocks, 16, align=align)
    kv_c, k_pe, slots = make_tokens(rng, n_tok, n_blocks * 16, n_negative=n_neg)
    with nki_sim.tracing() as trace:
        concat_and_cache_mla(kv_c, k_pe, cache, slots)
    valid = n_tok - n_neg
    ind = [e for e in dma_events(trace) if e.dma_kind == "indirect"]
    assert len(ind) == math.ceil(n_tok / 128)
    assert all(e.partitions <= 128 for e in ind)
    assert sum(len(e.descriptor_bytes) for e in ind) == valid
    assert all(b == 576 * 2 for e in ind for b in e.descriptor_bytes)
    assert sum(e.bytes for e in ind) == valid * 576 * 2
    assert sum(e.skipped_rows for e in ind) == n_neg
    n_tiles, rem = divmod(n_tok, 128)
    assert len(dma_events(trace)) == (3 + n_tiles if n_tiles else 0) + (4 if rem else 0)
    assert trace.summary()["dma_indirect_instructions"] == len(ind)


def test_direct_loads_one_descriptor_per_partition(one_core, rng):
    """256 tokens = 2 tiles in one chunk: index, kv_c and k_pe each arrive in one DMA with one
    contiguous run per partition."""
    cache = random_cache(rng, 20, 16)
    kv_c, k_pe, slots = make_tokens(rng, 256, 320)
    with nki_sim.tracing() as trace:
        concat_and_cache_mla(kv_c, k_pe, cache, slots)
    direct = [e for e in dma_events(trace) if e.dma_kind == "direct"]
    assert len(direct) == 3
    assert all(len(e.descriptor_bytes) == 128 for e in direct)
    assert sorted(e.bytes for e in direct) == sorted([256 * 4, 256 * 512 * 2, 256 * 64 * 2])
