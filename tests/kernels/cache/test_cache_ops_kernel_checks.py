"""The in-kernel input checks of the cache-op kernels, called directly (bypassing host validation).

Each checker has a must-pass twin (the valid call works and writes) and must-fail cases (the
kernel raises the documented exception type naming the argument, and the cache is untouched),
on both NKI APIs (``api``: the legacy and the current front end, trn2).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from host.cache.cache_ops import block_copy_row_pairs, cache_write_row_index
from nki_kernels.baselines.block_copy_batched import copy_rows_batched
from nki_kernels.cache.block_copy import copy_cache_blocks, swap_cache_blocks
from nki_kernels.toolchain import nisa
from nki_kernels.baselines.kv_write_per_token import kv_write_per_token
from nki_kernels.cache.kv_cache_update import kv_cache_update
from nki_kernels.row_tiles import plan_rows

pytestmark = pytest.mark.simulation
APIS = ("legacy", "nki")


def write_args(rng, *, n_tok=3, n_heads=2, d=8, n_blocks=2, block_size=4, dtype=np.float32):
    key = rng.standard_normal((n_tok, n_heads, d)).astype(dtype)
    value = rng.standard_normal((n_tok, n_heads, d)).astype(dtype)
    cache = rng.standard_normal((2, n_blocks, n_heads, block_size, d)).astype(dtype)
    idx = cache_write_row_index(np.arange(n_tok), num_blocks=n_blocks, num_kv_heads=n_heads,
                                block_size=block_size)
    return dict(key=key, value=value, kv_cache=cache, row_index=idx)


@pytest.mark.parametrize("api", APIS)
def test_kv_cache_update_valid_direct_call(rng, api):
    args = write_args(rng)
    cache = args["kv_cache"]
    kv_cache_update.for_api(api)(args["key"], args["value"], cache, args["row_index"])
    np.testing.assert_array_equal(cache[0, 0, :, :3, :], args["key"].transpose(1, 0, 2))
    np.testing.assert_array_equal(cache[1, 0, :, :3, :], args["value"].transpose(1, 0, 2))


@pytest.mark.parametrize("change,exc,match", [
    (lambda a: a.update(value=a["value"][:2]), ValueError, "value.shape"),
    (lambda a: a.update(key=a["key"][0]), ValueError, "key"),
    (lambda a: a.update(kv_cache=np.zeros((2, 2, 2, 4, 9), np.float32)), ValueError, "kv_cache.shape"),
    (lambda a: a.update(row_index=a["row_index"][:5]), ValueError, "row_index.shape"),
    (lambda a: a.update(row_index=a["row_index"].astype(np.int16)), ValueError, "row_index.dtype"),
    (lambda a: a.update(key=a["key"].astype(ml_dtypes.bfloat16)), ValueError, "dtype"),
    (lambda a: a.update(**write_args(np.random.default_rng(1), dtype=ml_dtypes.float8_e4m3fn)),
     NotImplementedError, "float8_e4m3fn is not supported.*float8_e4m3 byte view"),
    (lambda a: a.update(**write_args(np.random.default_rng(2), d=4097)), NotImplementedError, "head size"),
], ids=["value_shape", "key_rank", "cache_d", "index_shape", "index_dtype", "kv_dtype", "fp8", "huge_d"])
@pytest.mark.parametrize("api", APIS)
def test_kv_cache_update_rejects(rng, change, exc, match, api):
    args = write_args(rng)
    change(args)
    before = args["kv_cache"].tobytes()
    with pytest.raises(exc, match=match):
        kv_cache_update.for_api(api)(args["key"], args["value"], args["kv_cache"], args["row_index"])
    assert args["kv_cache"].tobytes() == before



def test_cache_writes_need_oob_skip_support(rng, monkeypatch):
    """A toolchain without ``nisa.oob_mode`` (Neuron SDK < 2.23) is refused up front, cache untouched."""
    args = write_args(rng)
    per_token_index = args["row_index"].reshape(3, 2, 1)
    monkeypatch.delattr(nisa, "oob_mode")
    before = args["kv_cache"].tobytes()
    with pytest.raises(NotImplementedError, match="SDK >= 2.23"):
        kv_cache_update.for_api("legacy")(args["key"], args["value"], args["kv_cache"],
                                          args["row_index"])
    with pytest.raises(NotImplementedError, match="SDK >= 2.23"):
        kv_write_per_token(args["key"], args["value"], args["kv_cache"], per_token_index)
    assert args["kv_cache"].tobytes() == before
    monkeypatch.undo()
    import nki_sim
    with nki_sim.configure(sdk="2.22"):          # the simulated 2.22 nki.isa has no oob_mode either
        with pytest.raises(NotImplementedError, match="SDK >= 2.23"):
            kv_cache_update.for_api("legacy")(args["key"], args["value"], args["kv_cache"],
                                              args["row_index"])
    assert args["kv_cache"].tobytes() == before
    kv_write_per_token(args["key"], args["value"], args["kv_cache"], per_token_index)   # must pass
    np.testing.assert_array_equal(args["kv_cache"][0, 0, :, :3, :], args["key"].transpose(1, 0, 2))


def floor(api):
    """The oldest toolchain the cache kernels claim on ``api``: legacy Neuron SDK 2.23 (dma_copy
    oob_mode) with Python control flow on traced loop variables as errors; current NKI 0.6."""
    import nki_sim

    if api == "legacy":
        return nki_sim.configure(sdk="2.23", traced_loops="error")
    from nki_sim.current import use_nki_version

    return use_nki_version("0.6")


@pytest.mark.parametrize("target, api", [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")])
def test_cache_ops_on_floor_sdk_with_traced_loop_checks(rng, monkeypatch, target, api):
    """The cache-op kernels on the oldest toolchain they claim (:func:`floor`); several chunks and
    a tail tile."""
    import warnings

    import nki_sim
    import nki_kernels.cache.block_copy as bc
    import nki_kernels.cache.kv_cache_update as kvu

    monkeypatch.setattr(kvu, "CHUNK_BUDGET_BYTES", 2 * (2 * 8 * 4 + 4))     # 2 tiles per chunk
    monkeypatch.setattr(bc, "INDEX_CHUNK_BUDGET_BYTES", 16)                 # 2 tiles per chunk
    n_tok, n_heads, d, n_blocks, block_size = 300, 2, 8, 80, 4               # 600 rows: 4 tiles + tail
    key = rng.standard_normal((n_tok, n_heads, d)).astype(np.float32)
    value = rng.standard_normal((n_tok, n_heads, d)).astype(np.float32)
    slots = rng.permutation(n_blocks * block_size)[:n_tok]
    slots[[0, 7]] = -1                                                      # padding: skipped
    cache = rng.standard_normal((2, n_blocks, n_heads, block_size, d)).astype(np.float32)
    expected = cache.copy()
    ok = slots >= 0
    expected[0, slots[ok] // block_size, :, slots[ok] % block_size, :] = key[ok]
    expected[1, slots[ok] // block_size, :, slots[ok] % block_size, :] = value[ok]
    idx = cache_write_row_index(slots, num_blocks=n_blocks, num_kv_heads=n_heads, block_size=block_size)

    src = np.arange(0, 39)
    dst = np.arange(40, 79)
    caches = rng.standard_normal((1, 2, n_blocks, n_heads, block_size, d)).astype(np.float32)
    copied = caches.copy()
    copied[:, :, dst] = copied[:, :, src]
    pairs = block_copy_row_pairs(src, dst, num_layers=1, src_num_blocks=n_blocks,
                                 dst_num_blocks=n_blocks, n_sub=8)           # 624 rows of d: 4 tiles + tail
    assert plan_rows(624, 8, 16).n_full_chunks == 2 and plan_rows(600, 68, 136).n_full_chunks == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with floor(api), nki_sim.use_target(target):
            kv_cache_update.for_api(api)(key, value, cache, idx)
            copy_cache_blocks.for_api(api)(caches, pairs, row_elems=d)
    assert cache.tobytes() == expected.tobytes()
    assert caches.tobytes() == copied.tobytes()

def copy_args(rng, *, n_layers=2, shape=(2, 6, 1, 2, 4), dtype=np.float32, row_elems=8):
    caches = rng.standard_normal((n_layers, *shape)).astype(dtype)
    n_sub = int(np.prod(shape[2:])) // row_elems
    pairs = block_copy_row_pairs(np.array([0, 1]), np.array([4, 5]), num_layers=n_layers,
                                 src_num_blocks=shape[1], dst_num_blocks=shape[1], n_sub=n_sub)
    return caches, pairs


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("index_dtype", [np.int32, np.uint32])
def test_copy_cache_blocks_valid_direct_call(rng, index_dtype, api):
    caches, pairs = copy_args(rng)
    expected = caches.copy()
    expected[:, :, 4:6] = expected[:, :, 0:2]
    copy_cache_blocks.for_api(api)(caches, pairs.astype(index_dtype), row_elems=8)
    assert caches.tobytes() == expected.tobytes()


@pytest.mark.parametrize("case,exc,match", [
    ("row_elems_not_divisor", ValueError, "row_elems"),
    ("row_elems_missing", ValueError, "row_elems"),
    ("pairs_dtype", ValueError, "row_pairs.dtype"),
    ("pairs_shape", ValueError, "row_pairs.shape"),
    ("cache_rank", ValueError, "kv_caches.shape"),
    ("row_too_big", NotImplementedError, "rows of"),
])
@pytest.mark.parametrize("api", APIS)
def test_copy_cache_blocks_rejects(rng, case, exc, match, api):
    caches, pairs = copy_args(rng)
    kwargs = {"row_elems": 8}
    if case == "row_elems_not_divisor":
        kwargs["row_elems"] = 3
    if case == "row_elems_missing":
        kwargs = {}
    if case == "pairs_dtype":
        pairs = pairs.astype(np.int16)
    if case == "pairs_shape":
        pairs = np.concatenate([pairs, pairs[:, :1]], axis=1)
    if case == "cache_rank":
        caches = caches[0]
    if case == "row_too_big":
        caches, pairs = copy_args(rng, shape=(2, 6, 1, 2, 8200), row_elems=16400)
        kwargs["row_elems"] = 16400
    before = caches.tobytes()
    with pytest.raises(exc, match=match):
        copy_cache_blocks.for_api(api)(caches, pairs, **kwargs)
    assert caches.tobytes() == before


@pytest.mark.parametrize("api", APIS)
def test_swap_cache_blocks_checks(rng, api):
    src = rng.standard_normal((2, 5, 1, 2, 4)).astype(np.float32)
    dst = rng.standard_normal((2, 3, 1, 2, 4)).astype(np.float32)
    pairs = block_copy_row_pairs(np.array([4]), np.array([1]), num_layers=1, src_num_blocks=5,
                                 dst_num_blocks=3, n_sub=1)
    expected = dst.copy()
    expected[:, 1] = src[:, 4]
    swap = swap_cache_blocks.for_api(api)
    swap(src, dst, pairs, row_elems=8)                                  # must pass
    assert dst.tobytes() == expected.tobytes()
    before = dst.tobytes()
    with pytest.raises(ValueError, match="dtype"):
        swap(src.astype(np.float16), dst, pairs, row_elems=8)
    with pytest.raises(ValueError, match=r"dst_cache.shape\[2:\]"):
        swap(np.zeros((2, 5, 1, 4, 2), np.float32), dst, pairs, row_elems=8)
    assert dst.tobytes() == before


def test_batched_baseline_checks(rng):
    caches, pairs = copy_args(rng)
    expected = caches.copy()
    expected[:, :, 4:6] = expected[:, :, 0:2]
    copy_rows_batched(caches, pairs, row_elems=8, batch_sizes=(3, 5))    # must pass
    assert caches.tobytes() == expected.tobytes()
    with pytest.raises(ValueError, match="batch_sizes"):
        copy_rows_batched(caches, pairs, row_elems=8, batch_sizes=(3, 4))


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_block_copies_on_the_legacy_floor_sdk(rng, target):
    """copy / swap need nothing newer than Neuron SDK 2.21 (nl.load / nl.store of an indirect row
    view; no oob_mode): they run on the project's legacy floor, with traced-loop checks."""
    import nki_sim

    caches, pairs = copy_args(rng)
    expected = caches.copy()
    expected[:, :, 4:6] = expected[:, :, 0:2]
    src = caches[0].copy()
    dst = np.zeros_like(src)
    with nki_sim.configure(sdk="2.21", traced_loops="error"), nki_sim.use_target(target):
        copy_cache_blocks.for_api("legacy")(caches, pairs, row_elems=8)
        swap_cache_blocks.for_api("legacy")(src, dst, pairs[:4], row_elems=8)
    assert caches.tobytes() == expected.tobytes()
    assert dst[:, 4:6].tobytes() == src[:, 0:2].tobytes()
