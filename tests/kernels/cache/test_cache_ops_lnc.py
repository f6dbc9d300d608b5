"""The cache ops on both physical cores of a trn2 logical core (current API, LNC=2): the two
cores split the rows (``nki_kernels.row_tiles``, "Cores"), every op leaves the same bytes as at
LNC 1 and as NumPy's own indexing, the modeled launch is the slower core's, and two cores are
refused where they cannot run before anything is written. The expectations are written with
NumPy slot indexing, not with the host's row-index builders."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host import allocate_mla_cache, concat_and_cache_mla
from host.cache.cache_ops import allocate_kv_caches, copy_blocks, reshape_and_cache, swap_blocks
from nki_sim import cost

pytestmark = pytest.mark.simulation
BF16 = np.dtype(ml_dtypes.bfloat16)


def _traced(fn, *args, **kw):
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
        fn(*args, **kw)
    return trace


def _cores(trace):
    return {e.attr("core", 0) for e in trace.events}


def _write_case(rng, n_tok, hkv=4, d=16, block=8, n_neg=3):
    n_blocks = math.ceil(n_tok / block) + 2
    cache = rng.standard_normal((2, n_blocks, hkv, block, d)).astype(np.float32)
    key = rng.standard_normal((n_tok, hkv, d)).astype(np.float32)
    value = rng.standard_normal((n_tok, hkv, d)).astype(np.float32)
    slots = rng.permutation(n_blocks * block)[:n_tok]
    slots[:min(n_neg, n_tok - 1)] = -1          # padding, and at least one slot to write
    want = cache.copy()
    for t, s in enumerate(slots):
        if s >= 0:
            want[0, s // block, :, s % block] = key[t]
            want[1, s // block, :, s % block] = value[t]
    return cache, key, value, slots, want


@pytest.mark.parametrize("n_tok", [1, 33, 64, 161, 700])
def test_cache_write_rows_split_between_the_cores(rng, n_tok):
    cache, key, value, slots, want = _write_case(rng, n_tok)
    one, two = cache.copy(), cache.copy()
    _traced(reshape_and_cache, key, value, one, slots, api="nki", lnc=1)
    trace = _traced(reshape_and_cache, key, value, two, slots, api="nki", lnc=2)
    assert two.tobytes() == want.tobytes() == one.tobytes()
    rows = n_tok * 4
    own = -(-rows // 2)                           # each core's rows (an odd count's middle on both)
    for core in (0, 1):
        stores = [e for e in trace.events if e.attr("core", 0) == core and e.engine == "dma"
                  and e.dma_kind == "indirect"]
        assert len(stores) == 2 * math.ceil(own / 128)                          # K and V
        assert sum(len(e.descriptor_bytes) + e.skipped_rows for e in stores) == 2 * own
    assert _cores(trace) == {0, 1}


def test_a_large_write_takes_about_half_the_modeled_time(rng):
    n_tok, hkv, d, block = 1024, 8, 128, 32
    cache = np.zeros((2, n_tok // block + 1, hkv, block, d), BF16)
    kv = rng.standard_normal((n_tok, hkv, d)).astype(BF16)
    slots = rng.permutation(n_tok)
    t1 = _traced(reshape_and_cache, kv, kv, cache.copy(), slots, api="nki", lnc=1)
    t2 = _traced(reshape_and_cache, kv, kv, cache.copy(), slots, api="nki", lnc=2)
    rep1, rep2 = (cost.estimate_cores(t, "trn2") for t in (t1, t2))
    assert rep2.launch_us == pytest.approx(max(r.modeled_us for r in rep2.per_core.values()))
    assert 0.45 < rep2.launch_us / rep1.launch_us < 0.6                 # MODELED, 8192 rows


def test_fp8_and_block_kv_writes_match_one_core(rng):
    hkv, d, block = 2, 16, 8
    cache, key, value, slots, _ = _write_case(rng, 150, hkv=hkv, d=d, block=block)
    n_blocks = cache.shape[1]
    fp8 = np.zeros((2, n_blocks, hkv, block, d), ml_dtypes.float8_e4m3fn)
    outs = []
    for lnc in (1, 2):
        c = fp8.copy()
        reshape_and_cache(key, value, c, slots, k_scale=0.5, v_scale=2.0, api="nki", lnc=lnc)
        outs.append(c)
    assert outs[0].tobytes() == outs[1].tobytes()
    want = np.clip(key[slots >= 0] / 0.5, -240, 240).astype(ml_dtypes.float8_e4m3fn)
    s = slots[slots >= 0]
    assert outs[1][0, s // block, :, s % block].tobytes() == want.tobytes()
    pair = (np.zeros((n_blocks, block, hkv, d), np.float32), np.zeros((n_blocks, block, hkv, d), np.float32))
    trace = _traced(reshape_and_cache, key, value, pair, slots, api="nki", lnc=2)
    assert _cores(trace) == {0, 1}
    np.testing.assert_array_equal(pair[0][s // block, s % block], key[slots >= 0])
    np.testing.assert_array_equal(pair[1][s // block, s % block], value[slots >= 0])


def test_block_copies_and_the_mla_write_match_one_core(rng):
    layers = allocate_kv_caches(3, 40, 2, 4, 8)
    for layer in layers:
        layer[...] = rng.standard_normal(layer.shape)
    ids = rng.permutation(40)
    mapping = np.stack([ids[:13], ids[13:26]], axis=1)
    want = [layer.copy() for layer in layers]
    for w in want:
        w[:, mapping[:, 1]] = w[:, mapping[:, 0]]
    trace = _traced(copy_blocks, layers, mapping, api="nki", lnc=2)
    assert _cores(trace) == {0, 1}
    assert all(a.tobytes() == b.tobytes() for a, b in zip(layers, want))

    src = rng.standard_normal((2, 30, 2, 4, 8)).astype(np.float32)
    dst = np.zeros((2, 10, 2, 4, 8), np.float32)
    swap = np.stack([np.arange(10) * 3, np.arange(10)[::-1]], axis=1)
    _traced(swap_blocks, src, dst, swap, api="nki", lnc=2)
    np.testing.assert_array_equal(dst[:, swap[:, 1]], src[:, swap[:, 0]])

    cache = allocate_mla_cache(20, 8, kv_lora_rank=64, qk_rope_head_dim=16, dtype=BF16)
    cache[...] = rng.standard_normal(cache.shape).astype(BF16)
    kv_c = rng.standard_normal((131, 64)).astype(BF16)
    k_pe = rng.standard_normal((131, 16)).astype(BF16)
    slots = rng.permutation(160)[:131]
    mla_want = cache.copy()
    mla_want[slots // 8, slots % 8, :64] = kv_c
    mla_want[slots // 8, slots % 8, 64:80] = k_pe
    trace = _traced(concat_and_cache_mla, kv_c, k_pe, cache, slots, api="nki", lnc=2)
    assert _cores(trace) == {0, 1} and cache.tobytes() == mla_want.tobytes()


def test_the_legacy_api_runs_one_program(rng):
    cache, key, value, slots, want = _write_case(rng, 40)
    trace = _traced(reshape_and_cache, key, value, cache, slots, api="legacy", lnc=2)
    assert _cores(trace) == {0} and cache.tobytes() == want.tobytes()


def test_two_cores_where_they_cannot_run_are_refused_before_any_write(rng):
    cache, key, value, slots, _ = _write_case(rng, 10)
    before = cache.tobytes()
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
        with pytest.raises(ValueError, match="lnc must be 1 or 2; got 3"):
            reshape_and_cache(key, value, cache, slots, api="nki", lnc=3)
        with pytest.raises(ValueError, match="lnc must be 1 or 2; got 0"):
            copy_blocks([cache], np.array([[0, 1]]), lnc=0)
    with nki_sim.use_target("trn1"), nki_sim.tracing() as trace1:
        with pytest.raises(NotImplementedError, match="trn1 logical core is one NeuronCore"):
            reshape_and_cache(key, value, cache, slots, api="legacy", lnc=2)
    assert not trace.events and not trace1.events and cache.tobytes() == before


@pytest.mark.parametrize("lnc, cores", [(1, {0}), (2, {0, 1})])
def test_every_delegating_path_keeps_the_callers_lnc(rng, lnc, cores):
    # copy_blocks on block-KV pairs and swap_blocks on one cache delegate to copy_blocks: the
    # launch they end in takes the caller's lnc, not the environment's
    pairs = [tuple(np.ascontiguousarray(rng.standard_normal((12, 4, 2, 8)).astype(np.float32))
                   for _ in range(2)) for _ in range(2)]
    want = [tuple(c.copy() for c in p) for p in pairs]
    for p in want:
        for c in p:
            c[[2, 4]] = c[[1, 3]]
    trace = _traced(copy_blocks, pairs, np.array([[1, 2], [3, 4]]), api="nki", lnc=lnc)
    assert _cores(trace) == cores
    assert all(a.tobytes() == b.tobytes() for p, q in zip(pairs, want) for a, b in zip(p, q))
    cache = rng.standard_normal((2, 10, 2, 4, 8)).astype(np.float32)
    trace = _traced(swap_blocks, cache, cache, np.array([[0, 5]]), api="nki", lnc=lnc)
    assert _cores(trace) == cores and (cache[:, 5] == cache[:, 0]).all()


def test_the_legacy_api_needs_no_core_placement_for_its_one_program(rng, monkeypatch):
    # a legacy front end without nl.nc cannot place programs on cores; the cache kernels run
    # one program there, so lnc=2 (e.g. from NEURON_LOGICAL_NC_CONFIG) is no reason to refuse
    from nki_kernels import toolchain

    monkeypatch.delattr(toolchain.resolve_api("legacy").ops.nl, "nc")
    cache, key, value, slots, want = _write_case(rng, 40, hkv=3)
    trace = _traced(reshape_and_cache, key, value, cache, slots, api="legacy", lnc=2)
    assert _cores(trace) == {0} and cache.tobytes() == want.tobytes()
