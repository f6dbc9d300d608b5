"""reshape_and_cache (host.cache.cache_ops) and its kernel nki_kernels.cache.kv_cache_update on the simulator.

Reference: a per-token loop written from the definition (cache[0, s // B, :, s % B, :] = key[t]),
sharing no code with the host's row-index builder. ``api`` runs a test on both NKI APIs (the
legacy and the current front end, trn2) where the second API adds coverage.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host.cache.cache_ops import cache_write_row_index, reshape_and_cache

pytestmark = pytest.mark.simulation
APIS = ("legacy", "nki")

DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]


def reference_write(key, value, cache, slots):
    """Expected cache after the write: per token, per definition; negative slots skipped."""
    out = cache.copy()
    block_size = cache.shape[3]
    for t, s in enumerate(np.asarray(slots).tolist()):
        if s < 0:
            continue
        out[0, s // block_size, :, s % block_size, :] = key[t].astype(cache.dtype)
        out[1, s // block_size, :, s % block_size, :] = value[t].astype(cache.dtype)
    return out


def make_case(rng, *, n_tok, n_heads, d, n_blocks, block_size, dtype=np.float32, kv_dtype=None,
              n_negative=0):
    """Random cache / key / value and distinct slots (the first n_negative tokens get -1 .. -k)."""
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    cache = rng.standard_normal((2, n_blocks, n_heads, block_size, d)).astype(dtype)
    key = rng.standard_normal((n_tok, n_heads, d)).astype(kv_dtype)
    value = rng.standard_normal((n_tok, n_heads, d)).astype(kv_dtype)
    slots = rng.permutation(n_blocks * block_size)[:n_tok].astype(np.int64)
    slots[:n_negative] = -1 - np.arange(n_negative)
    rng.shuffle(slots)
    return key, value, cache, slots


def assert_same_bits(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes(), (
        f"{int(np.sum(actual.view(np.uint8) != expected.view(np.uint8)))} bytes differ")


# ----------------------------------------------------------------------------- must-pass


@pytest.mark.parametrize("n_tok,n_heads,d,n_blocks,block_size", [
    pytest.param(1, 1, 8, 1, 8, id="one_token_one_head"),
    pytest.param(5, 2, 8, 4, 4, id="small"),
    pytest.param(64, 2, 16, 16, 8, id="exactly_one_tile"),          # R = 128
    pytest.param(70, 3, 5, 20, 16, id="tile_plus_tail_odd_d"),        # R = 210
    pytest.param(300, 1, 4, 40, 8, id="two_tiles_plus_tail"),         # R = 300
    pytest.param(17, 4, 32, 20, 1, id="block_size_1"),
])
@pytest.mark.parametrize("api", APIS)
def test_write_matches_reference(rng, n_tok, n_heads, d, n_blocks, block_size, api):
    key, value, cache, slots = make_case(rng, n_tok=n_tok, n_heads=n_heads, d=d,
                                         n_blocks=n_blocks, block_size=block_size)
    expected = reference_write(key, value, cache, slots)
    result = reshape_and_cache(key, value, cache, slots, api=api)
    assert result is cache  # updated in place, same object returned
    assert_same_bits(cache, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("kv_dtype", DTYPES, ids=lambda t: "kv_" + np.dtype(t).name)
def test_dtypes_cast_to_cache(rng, dtype, kv_dtype):
    key, value, cache, slots = make_case(rng, n_tok=40, n_heads=4, d=16, n_blocks=12, block_size=8,
                                         dtype=dtype, kv_dtype=kv_dtype, n_negative=3)
    expected = reference_write(key, value, cache, slots)
    reshape_and_cache(key, value, cache, slots)
    assert_same_bits(cache, expected)


@pytest.mark.parametrize("target, api", [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")])
def test_negative_slots_are_skipped(rng, target, api):
    """Padding slots (any negative value) write nothing; the last slot is NOT clobbered (no wrap)."""
    import nki_sim

    key, value, cache, _ = make_case(rng, n_tok=6, n_heads=2, d=8, n_blocks=3, block_size=4)
    slots = np.array([-1, 0, -1, 11, -7, 5])
    before = cache.copy()
    with nki_sim.use_target(target):
        reshape_and_cache(key, value, cache, slots, api=api)
    touched = np.zeros(cache.shape, dtype=bool)
    for s in (0, 11, 5):
        touched[:, s // 4, :, s % 4, :] = True
    assert_same_bits(cache[~touched].reshape(-1), before[~touched].reshape(-1))
    assert_same_bits(cache, reference_write(key, value, before, slots))
    # the wrap-around bug this guards against: slot -1 would hit the last slot (11 here, written
    # by token 3 with its own data, which must survive)
    np.testing.assert_array_equal(cache[0, 2, :, 3, :], key[3])


def test_all_slots_negative_is_a_no_op(rng):
    key, value, cache, _ = make_case(rng, n_tok=4, n_heads=2, d=8, n_blocks=2, block_size=4)
    before = cache.tobytes()
    reshape_and_cache(key, value, cache, np.full(4, -1))
    assert cache.tobytes() == before


def test_zero_tokens_is_a_no_op(rng):
    _, _, cache, _ = make_case(rng, n_tok=0, n_heads=2, d=8, n_blocks=2, block_size=4)
    before = cache.tobytes()
    reshape_and_cache(np.zeros((0, 2, 8), np.float32), np.zeros((0, 2, 8), np.float32), cache,
                      np.zeros(0, np.int64))
    assert cache.tobytes() == before


@pytest.mark.parametrize("api", APIS)
def test_several_chunks(rng, monkeypatch, api):
    """A tiny chunk budget forces several full chunks plus a short one plus a tail tile."""
    import nki_kernels.cache.kv_cache_update as mod

    monkeypatch.setattr(mod, "CHUNK_BUDGET_BYTES", 2 * (2 * 8 * 4 + 4))  # 2 tiles per chunk
    key, value, cache, slots = make_case(rng, n_tok=5 * 128 + 9, n_heads=1, d=8, n_blocks=200,
                                         block_size=4, n_negative=20)
    expected = reference_write(key, value, cache, slots)
    reshape_and_cache(key, value, cache, slots, api=api)
    assert_same_bits(cache, expected)


def test_last_valid_slot_and_duplicate_negatives_accepted(rng):
    """Boundary of the range check (N*B - 1 is valid) and repeated -1 are fine."""
    key, value, cache, _ = make_case(rng, n_tok=3, n_heads=1, d=4, n_blocks=2, block_size=4)
    slots = np.array([7, -1, -1])
    expected = reference_write(key, value, cache, slots)
    reshape_and_cache(key, value, cache, slots)
    assert_same_bits(cache, expected)


# ----------------------------------------------------------------------------- must-fail


@pytest.mark.parametrize("api, exc, match", [
    ("neuron", ValueError, r"api must be one of \('auto', 'legacy', 'nki'\); got 'neuron'"),
    (3, ValueError, "api must be one of"),
])
def test_bad_api_rejected_cache_untouched(rng, api, exc, match):
    key, value, cache, slots = make_case(rng, n_tok=3, n_heads=1, d=4, n_blocks=2, block_size=4)
    before = cache.tobytes()
    with pytest.raises(exc, match=match):
        reshape_and_cache(key, value, cache, slots, api=api)
    assert cache.tobytes() == before


def test_current_api_on_trn1_refused_cache_untouched(rng):
    """The current API supports trn2 / trn3 only: api="nki" on a simulated trn1 says so."""
    import nki_sim

    key, value, cache, slots = make_case(rng, n_tok=3, n_heads=1, d=4, n_blocks=2, block_size=4)
    before = cache.tobytes()
    with nki_sim.use_target("trn1"), pytest.raises(NotImplementedError, match="trn2 / trn3 only"):
        reshape_and_cache(key, value, cache, slots, api="nki")
    assert cache.tobytes() == before


@pytest.mark.parametrize("bad_slot", [8, 9, 10**6], ids=["N*B", "N*B+1", "huge"])
def test_out_of_range_slot_rejected_cache_untouched(rng, bad_slot):
    key, value, cache, _ = make_case(rng, n_tok=3, n_heads=1, d=4, n_blocks=2, block_size=4)
    before = cache.tobytes()
    with pytest.raises(ValueError, match=r"slot_mapping.*< num_blocks \* block_size = 8"):
        reshape_and_cache(key, value, cache, np.array([0, bad_slot, 3]))
    assert cache.tobytes() == before


def test_huge_unsigned_slot_is_rejected_not_skipped(rng):
    """uint64 2**64 - 1 must not wrap to -1 (which would mean "skip")."""
    key, value, cache, _ = make_case(rng, n_tok=2, n_heads=1, d=4, n_blocks=2, block_size=4)
    before = cache.tobytes()
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 18446744073709551615"):
        reshape_and_cache(key, value, cache, np.array([3, 2**64 - 1], dtype=np.uint64))
    assert cache.tobytes() == before
    reshape_and_cache(key, value, cache, np.array([3, 7], dtype=np.uint64))     # must pass
    np.testing.assert_array_equal(cache[0, 1, 0, 3], key[1, 0])


def test_duplicate_slots_rejected_cache_untouched(rng):
    key, value, cache, _ = make_case(rng, n_tok=4, n_heads=2, d=4, n_blocks=2, block_size=4)
    before = cache.tobytes()
    with pytest.raises(ValueError, match=r"slot_mapping must not repeat.*\[5\]"):
        reshape_and_cache(key, value, cache, np.array([5, 1, -1, 5]))
    assert cache.tobytes() == before


def _bad_inputs(rng):
    key, value, cache, slots = make_case(rng, n_tok=3, n_heads=2, d=4, n_blocks=2, block_size=4)
    f = np.float32
    return [
        ("key", dict(key=key[:, :1])),                                   # wrong Hkv
        ("key", dict(key=np.zeros((3, 2, 5), f))),                       # wrong d
        ("key", dict(key=key.astype(np.int32))),                         # not floating
        ("value", dict(value=value[:2])),                                # T mismatch
        ("slot_mapping", dict(slots=slots[:2])),                         # length mismatch
        ("slot_mapping", dict(slots=slots.astype(np.float32))),          # not integer
        ("slot_mapping", dict(slots=slots.reshape(3, 1))),               # not 1-D
        ("kv_cache", dict(cache=cache.astype(np.int16))),                # cache dtype
        ("kv_cache", dict(cache=cache[0])),                              # not (2, ...)
        ("kv_cache", dict(cache=np.asfortranarray(cache))),              # not C-contiguous
        ("kv_cache", dict(cache=cache.copy().view())),                   # read-only (set below)
    ], (key, value, cache, slots)


def test_bad_inputs_rejected_before_writing(rng):
    cases, (key, value, cache, slots) = _bad_inputs(rng)
    for i, (arg, override) in enumerate(cases):
        c = override.get("cache", cache.copy())
        if i == len(cases) - 1:
            c.setflags(write=False)
        before = c.tobytes()
        with pytest.raises(ValueError, match=arg):
            reshape_and_cache(override.get("key", key), override.get("value", value), c,
                              override.get("slots", slots))
        assert c.tobytes() == before


def test_fp8_cache_needs_scales_other_fp8_flavours_not_supported(rng):
    """fp8 writes have their own tests (test_cache_ops_fp8.py); here only the entry checks."""
    for dtype, exc, match in ((ml_dtypes.float8_e4m3fn, ValueError, "k_scale must be given"),
                              (ml_dtypes.float8_e4m3fnuz, NotImplementedError, "float8_e4m3fnuz")):
        cache = np.zeros((2, 2, 1, 4, 4), dtype)
        with pytest.raises(exc, match=match):
            reshape_and_cache(np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32), cache,
                              np.array([0]))


# ----------------------------------------------------------------------------- host index builder


def test_row_index_matches_definition():
    """row(t, h) of the (2, N*Hkv*B, d) view addresses cache[kv, s // B, h, s % B]; -1 -> 2*N*Hkv*B."""
    n_blocks, n_heads, block_size = 3, 2, 4
    slots = np.array([0, 5, -1, 11])
    idx = cache_write_row_index(slots, num_blocks=n_blocks, num_kv_heads=n_heads, block_size=block_size)
    assert idx.dtype == np.int32 and idx.shape == (8, 1)
    coords = np.arange(n_blocks * n_heads * block_size).reshape(n_blocks, n_heads, block_size)
    for t, s in enumerate(slots):
        for h in range(n_heads):
            want = 2 * n_blocks * n_heads * block_size if s < 0 else coords[s // block_size, h, s % block_size]
            assert idx[t * n_heads + h, 0] == want


# ----------------------------------------------------------------------------- property test


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_shapes_match_numpy(data):
    """Random shapes, dtypes, padding and chunk budgets (1 tile per chunk .. everything in one)."""
    import nki_kernels.cache.kv_cache_update as mod

    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    rng = np.random.default_rng(seed)
    n_heads = data.draw(st.integers(1, 4), label="Hkv")
    d = data.draw(st.integers(1, 40), label="d")
    block_size = data.draw(st.sampled_from([1, 2, 4, 8, 16]), label="B")
    n_blocks = data.draw(st.integers(1, 80), label="N")
    n_tok = data.draw(st.integers(0, min(n_blocks * block_size, 600)), label="T")
    n_negative = data.draw(st.integers(0, n_tok), label="negatives")
    dtype = data.draw(st.sampled_from(DTYPES), label="cache dtype")
    kv_dtype = data.draw(st.sampled_from(DTYPES), label="kv dtype")
    key, value, cache, slots = make_case(rng, n_tok=n_tok, n_heads=n_heads, d=d, n_blocks=n_blocks,
                                         block_size=block_size, dtype=dtype, kv_dtype=kv_dtype,
                                         n_negative=n_negative)
    budget = data.draw(st.sampled_from([None, 1, 3000]), label="chunk budget")
    expected = reference_write(key, value, cache, slots)
    with pytest.MonkeyPatch.context() as mp:
        if budget is not None:
            mp.setattr(mod, "CHUNK_BUDGET_BYTES", budget)
        reshape_and_cache(key, value, cache, slots)
    assert_same_bits(cache, expected)


def test_realistic_prefill_batch_bf16(rng):
    """A vLLM-sized write: 1024 tokens x 8 KV heads x d 128 into a bf16 cache, 10% padding slots."""
    key, value, cache, slots = make_case(rng, n_tok=1024, n_heads=8, d=128, n_blocks=80, block_size=32,
                                         dtype=ml_dtypes.bfloat16, n_negative=102)
    expected = reference_write(key, value, cache, slots)
    reshape_and_cache(key, value, cache, slots)
    assert_same_bits(cache, expected)


@pytest.mark.parametrize("api", APIS)
def test_the_requested_api_runs(rng, monkeypatch, api):
    """api= reaches every cache op's launch: its kernel family is jitted for that API only."""
    from host.cache.cache_ops import copy_blocks, swap_blocks
    from host.cache.mla_cache import concat_and_cache_mla
    from nki_kernels.ops import KernelFamily

    asked = []
    real = KernelFamily.for_api

    def spy(self, name):
        asked.append((self.__name__, name))
        return real(self, name)

    monkeypatch.setattr(KernelFamily, "for_api", spy)
    key, value, cache, slots = make_case(rng, n_tok=3, n_heads=1, d=4, n_blocks=4, block_size=4)
    reshape_and_cache(key, value, cache, slots, api=api)
    copy_blocks([cache], [[0, 3]], api=api)
    swap_blocks(cache, np.zeros_like(cache), [[1, 2]], api=api)
    concat_and_cache_mla(key[:, 0], value[:, 0], np.zeros((2, 4, 8), np.float32), [0, 5, -1],
                         api=api)
    assert {k for k, _ in asked} == {"kv_cache_update", "copy_cache_blocks", "swap_cache_blocks",
                                     "mla_cache_update"}
    assert {a for _, a in asked} == {api}
