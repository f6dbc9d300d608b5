"""FP8 KV caches in the cache ops on the simulator: the quantizing write (kv_cache_update_fp8 via
host.reshape_and_cache) and byte-exact block copies / swaps.

Reference: a per-token loop quantizing from the definition, cache = fp8(clamp(float32(x) *
float32(1 / scale), -S, S)) with round-to-nearest-even, S = 240 (float8_e4m3fn, this project's
saturation) or 57344 (float8_e5m2); it shares no code with host/fp8.py or the kernel.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host.cache.cache_ops import (allocate_kv_caches, cache_write_row_index, copy_blocks,
                            kv_caches_share_buffer, reshape_and_cache, swap_blocks)
from nki_kernels.cache.kv_cache_update import kv_cache_update, kv_cache_update_fp8

pytestmark = pytest.mark.simulation
APIS = ("legacy", "nki")

E4M3FN, E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
BOUND = {E4M3FN: 240.0, E5M2: 57344.0}
FP8 = [E4M3FN, E5M2]


def quantize(x, scale, fp8):
    inv = np.float32(1.0) / np.float32(scale)
    return np.clip(np.asarray(x).astype(np.float32) * inv, -BOUND[fp8], BOUND[fp8]).astype(fp8)


def reference_write(key, value, cache, slots, k_scale, v_scale):
    out = cache.copy()
    n_heads, block_size = cache.shape[2], cache.shape[3]
    ks = np.broadcast_to(np.float32(k_scale), (n_heads,))
    vs = np.broadcast_to(np.float32(v_scale), (n_heads,))
    for t, s in enumerate(np.asarray(slots).tolist()):
        if s < 0:
            continue
        for h in range(n_heads):
            out[0, s // block_size, h, s % block_size] = quantize(key[t, h], ks[h], cache.dtype)
            out[1, s // block_size, h, s % block_size] = quantize(value[t, h], vs[h], cache.dtype)
    return out


def make_case(rng, *, n_tok, n_heads, d, n_blocks, block_size, fp8, kv_dtype=np.float32, amp=100.0,
              n_negative=0):
    cache = rng.integers(0, 256, (2, n_blocks, n_heads, block_size, d), dtype=np.uint8).view(fp8)
    key = (rng.standard_normal((n_tok, n_heads, d)) * amp).astype(kv_dtype)
    value = (rng.standard_normal((n_tok, n_heads, d)) * amp).astype(kv_dtype)
    slots = rng.permutation(n_blocks * block_size)[:n_tok].astype(np.int64)
    slots[:n_negative] = -1
    rng.shuffle(slots)
    return key, value, cache, slots


def assert_same_bytes(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    diff = actual.view(np.uint8) != expected.view(np.uint8)
    assert not diff.any(), f"{int(diff.sum())} bytes differ, first at {np.argwhere(diff)[0].tolist()}"


# ----------------------------------------------------------------------------- quantizing write


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3fn", "e5m2"])
@pytest.mark.parametrize("kv_dtype", [np.float32, ml_dtypes.bfloat16, np.float16, np.float64],
                         ids=lambda t: "kv_" + np.dtype(t).name)
def test_write_matches_numpy_quantization_exact_bytes(rng, fp8, kv_dtype):
    """Per-head scales, padding slots, a bulk tile plus a tail tile (R = 70 * 3 = 210 rows)."""
    key, value, cache, slots = make_case(rng, n_tok=70, n_heads=3, d=12, n_blocks=30, block_size=4,
                                         fp8=fp8, kv_dtype=kv_dtype, n_negative=6)
    k_scale = np.array([0.5, 0.2, 1.5], np.float32)
    v_scale = np.array([0.3, 2.0, 0.05], np.float32)
    expected = reference_write(key, value, cache, slots, k_scale, v_scale)
    before = cache.copy()
    assert reshape_and_cache(key, value, cache, slots, k_scale=k_scale, v_scale=v_scale) is cache
    assert_same_bytes(cache, expected)
    assert (cache.view(np.uint8) != before.view(np.uint8)).any()


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3fn", "e5m2"])
def test_per_tensor_scale_and_several_chunks(rng, monkeypatch, fp8):
    import nki_kernels.cache.kv_cache_update as mod

    monkeypatch.setattr(mod, "CHUNK_BUDGET_BYTES", 2 * (2 * 8 * 4 + 12))      # 2 tiles per chunk
    key, value, cache, slots = make_case(rng, n_tok=5 * 128 + 9, n_heads=1, d=8, n_blocks=200,
                                         block_size=4, fp8=fp8, n_negative=20)
    expected = reference_write(key, value, cache, slots, 0.75, np.float64(0.1))
    reshape_and_cache(key, value, cache, slots, k_scale=0.75, v_scale=np.float64(0.1))
    assert_same_bytes(cache, expected)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_shapes_match_numpy(data):
    """Random head sizes 1..512, heads, block sizes, padding, input dtypes, formats and scales."""
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    rng = np.random.default_rng(seed)
    n_heads = data.draw(st.integers(1, 4), label="Hkv")
    d = data.draw(st.integers(1, 512), label="d")
    block_size = data.draw(st.sampled_from([1, 2, 8, 16]), label="B")
    n_blocks = data.draw(st.integers(1, 20), label="N")
    n_tok = data.draw(st.integers(0, min(n_blocks * block_size, 150)), label="T")
    fp8 = data.draw(st.sampled_from(FP8), label="format")
    kv_dtype = data.draw(st.sampled_from([np.float32, ml_dtypes.bfloat16, np.float16]), label="kv dtype")
    per_head = data.draw(st.booleans(), label="per-head scales")
    key, value, cache, slots = make_case(rng, n_tok=n_tok, n_heads=n_heads, d=d, n_blocks=n_blocks,
                                         block_size=block_size, fp8=fp8, kv_dtype=kv_dtype,
                                         amp=float(rng.choice([1.0, 100.0, 1e4])),
                                         n_negative=data.draw(st.integers(0, n_tok), label="negatives"))
    k_scale = rng.uniform(0.01, 3.0, n_heads).astype(np.float32) if per_head else float(rng.uniform(0.01, 3.0))
    v_scale = rng.uniform(0.01, 3.0, n_heads).astype(np.float32) if per_head else float(rng.uniform(0.01, 3.0))
    expected = reference_write(key, value, cache, slots, k_scale, v_scale)
    reshape_and_cache(key, value, cache, slots, k_scale=k_scale, v_scale=v_scale)
    assert_same_bytes(cache, expected)


def test_per_head_scales_hand_computed():
    cache = np.zeros((2, 1, 2, 2, 4), E4M3FN)
    key = np.ones((1, 2, 4), np.float32)
    value = np.full((1, 2, 4), 3.0, np.float32)
    reshape_and_cache(key, value, cache, np.array([1]), k_scale=np.array([0.5, 0.25]), v_scale=[1.0, 0.5])
    np.testing.assert_array_equal(cache[0, 0, :, 1].astype(np.float32), [[2.0] * 4, [4.0] * 4])
    np.testing.assert_array_equal(cache[1, 0, :, 1].astype(np.float32), [[3.0] * 4, [6.0] * 4])
    assert not cache[:, 0, :, 0].astype(np.float32).any()          # slot 0 untouched


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3fn", "e5m2"])
def test_saturation(fp8):
    """Out-of-range values (and +-inf) are clipped to +-S, never written as inf / NaN; for
    e4m3fn that includes 256..448, which vLLM would keep (the documented deviation)."""
    big = np.array([239.0, 240.0, 247.0, 256.0, 300.0, 448.0, 500.0, 1e6, 6e4, 1e30, np.inf], np.float32)
    x = np.concatenate([big, -big]).reshape(1, 1, -1)            # d = 22
    cache = np.zeros((2, 1, 1, 1, x.shape[2]), fp8)
    reshape_and_cache(x, x / 2, cache, np.array([0]), k_scale=1.0, v_scale=0.5)
    got = cache[:, 0, 0, 0].astype(np.float64)
    assert np.isfinite(got).all()
    expected = np.clip(x[0, 0].astype(np.float64), -BOUND[fp8], BOUND[fp8]).astype(fp8).astype(np.float64)
    np.testing.assert_array_equal(got[0], expected)
    np.testing.assert_array_equal(got[1], expected)
    assert got[0].max() == BOUND[fp8] and got[0].min() == -BOUND[fp8]
    if fp8 == E4M3FN:
        assert got[0, 5] == 240.0                                  # 448 would fit e4m3fn; clipped
        assert cache.view(np.uint8).max() <= 0xF7 and not np.isin(cache.view(np.uint8) & 0x7F, range(0x78, 0x80)).any()


def test_torch_fp8_cache_updated_in_place(rng):
    torch = pytest.importorskip("torch")
    key, value, cache, slots = make_case(rng, n_tok=9, n_heads=2, d=8, n_blocks=4, block_size=4, fp8=E4M3FN)
    expected = reference_write(key, value, cache, slots, 0.4, 0.7)
    t_cache = torch.from_numpy(cache.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    assert reshape_and_cache(torch.from_numpy(key), torch.from_numpy(value), t_cache, torch.from_numpy(slots),
                             k_scale=torch.tensor(0.4), v_scale=0.7) is t_cache
    assert_same_bytes(t_cache.view(torch.uint8).numpy().view(E4M3FN), expected)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(), ValueError, r"k_scale must be given for a float8_e4m3fn KV cache"),
    (dict(k_scale=1.0), ValueError, r"v_scale must be given for a float8_e4m3fn KV cache"),
    (dict(k_scale=[1.0, 2.0, 3.0], v_scale=1.0), ValueError, r"k_scale must be a float, a 1-element array"),
    (dict(k_scale=0.0, v_scale=1.0), ValueError, r"k_scale must hold finite values > 0"),
    (dict(k_scale=1.0, v_scale=np.nan), ValueError, r"v_scale must hold finite values > 0"),
    (dict(k_scale=1.0, v_scale=1.0, slots=np.array([0, 0, -1])), ValueError, r"slot_mapping must not repeat"),
    (dict(k_scale=1.0, v_scale=1.0, cache_dtype=np.float32), ValueError,
     r"k_scale must be None for a float32 KV cache \(scales apply to float8_e4m3fn / float8_e5m2 caches only\)"),
    (dict(v_scale=1.0, cache_dtype=ml_dtypes.bfloat16), ValueError, r"v_scale must be None for a bfloat16 KV cache"),
    (dict(k_scale=1.0, v_scale=1.0, cache_dtype=ml_dtypes.float8_e4m3), NotImplementedError,
     r"float8_e4m3 KV cache is not supported; use float32, bfloat16, float16, float8_e4m3fn or float8_e5m2"),
], ids=["no_scales", "no_v_scale", "scale_shape", "zero_scale", "nan_scale", "dup_slot", "scale_fp32_cache",
        "scale_bf16_cache", "ieee_e4m3_cache"])
def test_rejected_before_writing(rng, kwargs, exc, match):
    kwargs = dict(kwargs)
    dt = np.dtype(kwargs.pop("cache_dtype", E4M3FN))
    cache = rng.integers(0, 120, (2, 2, 2, 4, 8), dtype=np.uint8).view(dt) if dt.itemsize == 1 else \
        rng.standard_normal((2, 2, 2, 4, 8)).astype(dt)
    key = rng.standard_normal((3, 2, 8)).astype(np.float32)
    slots = kwargs.pop("slots", np.array([0, 5, -1]))
    before = cache.tobytes()
    with pytest.raises(exc, match=match):
        reshape_and_cache(key, key, cache, slots, **kwargs)
    assert cache.tobytes() == before


# ----------------------------------------------------------------------------- kernel checks


def fp8_args(rng, *, n_tok=3, n_heads=2, d=8, cache_dtype=ml_dtypes.float8_e4m3, kv_dtype=np.float32):
    key = rng.standard_normal((n_tok, n_heads, d)).astype(kv_dtype)
    cache = np.zeros((2, 2, n_heads, 4, d), cache_dtype)
    idx = cache_write_row_index(np.arange(n_tok), num_blocks=2, num_kv_heads=n_heads, block_size=4)
    scale = np.full((n_tok * n_heads, 2), 2.0, np.float32)
    return dict(key=key, value=-key, kv_cache=cache, row_index=idx, row_scale=scale)


@pytest.mark.parametrize("api", APIS)
def test_fp8_kernel_valid_direct_call(rng, api):
    a = fp8_args(rng)
    kv_cache_update_fp8.for_api(api)(**a)
    want = np.clip(a["key"] * 2, -240, 240).astype(ml_dtypes.float8_e4m3).transpose(1, 0, 2)
    assert a["kv_cache"][0, 0, :, :3].tobytes() == want.tobytes()
    assert a["kv_cache"][1, 0, :, :3].tobytes() == (-want.astype(np.float32)).astype(ml_dtypes.float8_e4m3).tobytes()


@pytest.mark.parametrize("change,exc,match", [
    (dict(cache_dtype=np.float32), NotImplementedError, "use kv_cache_update for float32"),
    (dict(cache_dtype=ml_dtypes.float8_e4m3fn), NotImplementedError, "float8_e4m3fn"),
    (dict(row_scale=np.ones((5, 2), np.float32)), ValueError, r"row_scale.shape must be \(6, 2\)"),
    (dict(row_scale=np.ones((6, 2), np.float16)), ValueError, "row_scale.dtype must be float32"),
    (dict(kv_dtype=ml_dtypes.float8_e5m2), ValueError, "key.dtype must be float32, bfloat16 or float16"),
    (dict(value_dtype=np.float16), ValueError, r"value.dtype must equal key.dtype"),
    (dict(row_index=np.zeros((6, 1), np.int16)), ValueError, "row_index.dtype"),
], ids=["fp32_cache", "e4m3fn_cache", "scale_shape", "scale_dtype", "key_dtype", "value_dtype", "index_dtype"])
@pytest.mark.parametrize("api", APIS)
def test_fp8_kernel_rejects(rng, change, exc, match, api):
    change = dict(change)
    a = fp8_args(rng, **{k: change.pop(k) for k in ("cache_dtype", "kv_dtype") if k in change})
    if "value_dtype" in change:
        a["value"] = a["value"].astype(change.pop("value_dtype"))
    a.update(change)
    before = a["kv_cache"].tobytes()
    with pytest.raises(exc, match=match):
        kv_cache_update_fp8.for_api(api)(**a)
    assert a["kv_cache"].tobytes() == before


@pytest.mark.parametrize("api", APIS)
def test_unscaled_kernel_refuses_fp8_caches(rng, api):
    a = fp8_args(rng, kv_dtype=ml_dtypes.float8_e4m3)
    before = a["kv_cache"].tobytes()
    with pytest.raises(NotImplementedError, match="write fp8 caches with kv_cache_update_fp8"):
        kv_cache_update.for_api(api)(a["key"], a["value"], a["kv_cache"], a["row_index"])
    assert a["kv_cache"].tobytes() == before


# ----------------------------------------------------------------------------- byte copies


ALL_BYTES = np.arange(256, dtype=np.uint8)


@pytest.mark.parametrize("fp8", FP8, ids=["e4m3fn", "e5m2"])
def test_copy_and_swap_move_every_byte_pattern_unchanged(rng, fp8):
    """All 256 patterns (e4m3fn 256..448 and NaN, e5m2 inf / NaN) survive copy_blocks (zero-copy
    path over allocate_kv_caches, and the stacking path) and swap_blocks bit for bit."""
    caches = allocate_kv_caches(2, 6, 2, 4, 16, dtype=fp8)            # slab 2*4*16 = 128 bytes
    assert kv_caches_share_buffer(caches) and all(c.dtype == fp8 for c in caches)
    for c in caches:
        c.view(np.uint8)[...] = rng.permutation(np.resize(ALL_BYTES, c.size)).reshape(c.shape)
    expected = [c.copy() for c in caches]
    for e in expected:
        e[:, [4, 5]] = e[:, [0, 2]]
    copy_blocks(caches, np.array([[0, 4], [2, 5]]))
    for c, e in zip(caches, expected):
        assert_same_bytes(c, e)

    separate = [c.copy() for c in caches]                                # not one buffer: stacked
    assert not kv_caches_share_buffer(separate)
    copy_blocks(separate, np.array([[1, 3]]))
    for c, e in zip(separate, expected):
        e[:, 3] = e[:, 1]
        assert_same_bytes(c, e)

    host = rng.permutation(np.resize(ALL_BYTES, 2 * 3 * 2 * 4 * 16)).astype(np.uint8).view(fp8)
    host = host.reshape(2, 3, 2, 4, 16)
    dst = caches[0]
    want = dst.copy()
    want[:, [1, 0]] = host[:, [2, 0]]
    swap_blocks(host, dst, np.array([[2, 1], [0, 0]]))
    assert_same_bytes(dst, want)


def test_copy_rejects_mixed_fp8_flavours(rng):
    a = np.zeros((2, 3, 1, 2, 4), E4M3FN)
    b = np.zeros((2, 3, 1, 2, 4), E5M2)
    with pytest.raises(ValueError, match="dtype"):
        swap_blocks(a, b, np.array([[0, 1]]))
    with pytest.raises(ValueError, match="dtype"):
        copy_blocks([a, b], np.array([[0, 1]]))


# ----------------------------------------------------------------------------- simulator fp8 reads


def test_simulator_reads_the_e4m3_view_as_ieee_e4m3():
    """What a kernel sees when it loads an e4m3fn cache through its float8_e4m3 view: the 240
    shared patterns decode to the e4m3fn values, the 14 others to inf / NaN -- which is why the
    write saturates at 240."""
    from nki_kernels.toolchain import nki, nl

    @nki.jit
    def widen(x):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, nl.copy(t, dtype=nl.float32))
        return out

    src = ALL_BYTES.reshape(2, 128).view(E4M3FN)
    got = widen(src.view(ml_dtypes.float8_e4m3)).reshape(-1).astype(np.float64)
    fn = ALL_BYTES.view(E4M3FN).astype(np.float64)
    shared = np.isfinite(fn) & (np.abs(fn) <= 240)
    np.testing.assert_array_equal(got[shared], fn[shared])
    assert not np.isfinite(got[~shared]).any()
    assert np.isinf(got[[0x78, 0xF8]]).all() and np.isnan(got[[0x79, 0x7E, 0x7F, 0xFF]]).all()


# ----------------------------------------------------------------------------- instruction counts


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("n_tok,n_heads", [(16, 8), (100, 3), (1, 1)], ids=["one_tile", "tile_and_tail", "tail_only"])
def test_fp8_write_instruction_counts(one_core, rng, n_tok, n_heads, api):
    """The documented plan: per chunk an index, K, V and row_scale load; per tile a ScalarE scale
    and a VectorE clamp+cast for K and for V, then two indirect stores (all tiles in one chunk)."""
    import nki_sim

    d, block_size = 16, 8
    n_blocks = -(-n_tok // block_size) + 1
    cache = np.zeros((2, n_blocks, n_heads, block_size, d), E5M2)
    key = rng.standard_normal((n_tok, n_heads, d)).astype(ml_dtypes.bfloat16)
    slots = rng.permutation(n_blocks * block_size)[:n_tok]
    with nki_sim.tracing() as trace:
        reshape_and_cache(key, key, cache, slots, k_scale=0.5, v_scale=2.0, api=api)
    n_tiles, rem = divmod(n_tok * n_heads, 128)
    tiles = n_tiles + (1 if rem else 0)
    ev = trace.events
    dma = [e for e in ev if e.engine == "dma"]
    assert len(dma) == 4 * (1 if n_tiles else 0) + 4 * (1 if rem else 0) + 2 * tiles
    assert len([e for e in dma if e.dma_kind == "indirect"]) == 2 * tiles
    scalar = [e for e in ev if e.engine == "scalar"]
    vector = [e for e in ev if e.engine == "vector"]
    assert [e.op for e in scalar] == ["activation"] * 2 * tiles
    assert [e.op for e in vector] == ["tensor_scalar"] * 2 * tiles
    assert all(e.out_dtype == "float8_e5m2" for e in vector)
    assert sum(e.bytes for e in dma if e.dma_kind == "indirect") == 2 * n_tok * n_heads * d   # 1 byte each


@pytest.mark.parametrize("target, api", [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")])
def test_fp8_write_on_floor_sdk_with_traced_loop_checks(rng, monkeypatch, target, api):
    """kv_cache_update_fp8 uses nothing newer than legacy SDK 2.23 (dma_copy oob_mode; no Python
    control flow on traced loop variables) or current NKI 0.6; several chunks + a tail."""
    import warnings

    import nki_sim
    import nki_kernels.cache.kv_cache_update as mod
    from nki_sim.current import use_nki_version

    monkeypatch.setattr(mod, "CHUNK_BUDGET_BYTES", 2 * (2 * 8 * 4 + 12))      # 2 tiles per chunk
    key, value, cache, slots = make_case(rng, n_tok=300, n_heads=2, d=8, n_blocks=80, block_size=4,
                                         fp8=E4M3FN, n_negative=7)             # 600 rows
    expected = reference_write(key, value, cache, slots, 0.3, 0.6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        floor = (nki_sim.configure(sdk="2.23", traced_loops="error") if api == "legacy"
                 else use_nki_version("0.6"))
        with floor, nki_sim.use_target(target):
            reshape_and_cache(key, value, cache, slots, k_scale=0.3, v_scale=0.6, api=api)
    assert_same_bytes(cache, expected)
