"""The in-kernel input checks of nki_kernels.cache.mla_cache_update, called directly (no host validation).

A must-pass direct call, then one must-fail case per check: the documented exception type naming
the argument, and the cache untouched; on both NKI APIs (``api``, trn2).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.cache.mla_cache import mla_cache_write_row_index
from nki_kernels.toolchain import nisa
from nki_kernels.cache.mla_cache_update import mla_cache_update

pytestmark = pytest.mark.simulation
APIS = ("legacy", "nki")


def write_args(rng, *, n_tok=3, R=8, P=4, E=16, n_blocks=2, block_size=4, dtype=np.float32):
    kv_c = rng.standard_normal((n_tok, R)).astype(dtype)
    k_pe = rng.standard_normal((n_tok, P)).astype(dtype)
    cache = rng.standard_normal((n_blocks, block_size, E)).astype(dtype)
    idx = mla_cache_write_row_index(np.arange(n_tok), num_blocks=n_blocks, block_size=block_size)
    return dict(kv_c=kv_c, k_pe=k_pe, kv_cache=cache, row_index=idx)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("index_dtype", [np.int32, np.uint32])
def test_valid_direct_call(rng, index_dtype, api):
    args = write_args(rng)
    cache = args["kv_cache"]
    padding = cache[..., 12:].copy()
    mla_cache_update.for_api(api)(args["kv_c"], args["k_pe"], cache, args["row_index"].astype(index_dtype))
    np.testing.assert_array_equal(cache[0, :3, :8], args["kv_c"])
    np.testing.assert_array_equal(cache[0, :3, 8:12], args["k_pe"])
    np.testing.assert_array_equal(cache[..., 12:], padding)


def test_row_index_is_the_slot_and_negative_is_out_of_bounds():
    idx = mla_cache_write_row_index(np.array([5, -1, 0, -3]), num_blocks=3, block_size=4)
    assert idx.dtype == np.int32 and idx.tolist() == [[5], [12], [0], [12]]


@pytest.mark.parametrize("change,exc,match", [
    (lambda a: a.update(kv_c=a["kv_c"][0]), ValueError, "kv_c"),
    (lambda a: a.update(k_pe=a["k_pe"][:2]), ValueError, "k_pe.shape"),
    (lambda a: a.update(kv_cache=a["kv_cache"][None]), ValueError, "kv_cache.shape"),
    (lambda a: a.update(kv_cache=np.zeros((2, 4, 11), np.float32)), ValueError, r"entry size E"),
    (lambda a: a.update(row_index=a["row_index"][:2]), ValueError, "row_index.shape"),
    (lambda a: a.update(row_index=a["row_index"].astype(np.int16)), ValueError, "row_index.dtype"),
    (lambda a: a.update(kv_c=a["kv_c"].astype(ml_dtypes.bfloat16)), ValueError, "dtype"),
    (lambda a: a.update(**write_args(np.random.default_rng(1), dtype=ml_dtypes.float8_e4m3fn)),
     NotImplementedError, "float8_e4m3fn is not supported"),
    (lambda a: a.update(**write_args(np.random.default_rng(2), R=4096, E=4100)), NotImplementedError,
     "written elements"),
], ids=["kv_c_rank", "k_pe_shape", "cache_rank", "entry_too_small", "index_shape", "index_dtype",
        "input_dtype", "fp8", "huge_entry"])
@pytest.mark.parametrize("api", APIS)
def test_kernel_rejects(rng, change, exc, match, api):
    args = write_args(rng)
    change(args)
    before = args["kv_cache"].tobytes()
    with pytest.raises(exc, match=match):
        mla_cache_update.for_api(api)(args["kv_c"], args["k_pe"], args["kv_cache"], args["row_index"])
    assert args["kv_cache"].tobytes() == before


def test_needs_oob_skip_support(rng, monkeypatch):
    """A toolchain without nisa.oob_mode (Neuron SDK < 2.23) is refused up front, cache untouched."""
    args = write_args(rng)
    before = args["kv_cache"].tobytes()
    with nki_sim.configure(sdk="2.22"):
        with pytest.raises(NotImplementedError, match="SDK >= 2.23"):
            mla_cache_update.for_api("legacy")(args["kv_c"], args["k_pe"], args["kv_cache"],
                                               args["row_index"])
    monkeypatch.delattr(nisa, "oob_mode")
    with pytest.raises(NotImplementedError, match="SDK >= 2.23"):
        mla_cache_update.for_api("legacy")(args["kv_c"], args["k_pe"], args["kv_cache"], args["row_index"])
    assert args["kv_cache"].tobytes() == before


@pytest.mark.parametrize("api", APIS)
def test_block_copy_kernels_take_one_half_mla_views(rng, api):
    """copy_cache_blocks / swap_cache_blocks accept the (.., 1, N, 1, B, E) view of MLA caches (must
    pass) and still reject other K/V axis sizes and mismatched halves (must fail, untouched)."""
    from host.cache.cache_ops import block_copy_row_pairs
    from nki_kernels.cache.block_copy import copy_cache_blocks, swap_cache_blocks

    copy_cache_blocks, swap_cache_blocks = (copy_cache_blocks.for_api(api),
                                            swap_cache_blocks.for_api(api))
    caches = rng.standard_normal((2, 1, 5, 1, 4, 6)).astype(np.float32)        # 2 MLA layers
    pairs = block_copy_row_pairs(np.array([0]), np.array([3]), num_layers=2, src_num_blocks=5,
                                 dst_num_blocks=5, n_sub=1, halves=1)
    assert pairs.tolist() == [[0, 3], [5, 8]]                                    # (layer * N + block)
    expected = caches.copy()
    expected[:, :, 3] = expected[:, :, 0]
    copy_cache_blocks(caches, pairs, row_elems=24)
    assert caches.tobytes() == expected.tobytes()

    three = rng.standard_normal((1, 3, 5, 1, 4, 6)).astype(np.float32)
    before = three.tobytes()
    with pytest.raises(ValueError, match=r"kv_caches.shape"):
        copy_cache_blocks(three, pairs[:1], row_elems=24)
    assert three.tobytes() == before

    src = rng.standard_normal((1, 5, 1, 4, 6)).astype(np.float32)
    dst = rng.standard_normal((1, 3, 1, 4, 6)).astype(np.float32)
    swap_pairs = block_copy_row_pairs(np.array([4]), np.array([1]), num_layers=1, src_num_blocks=5,
                                      dst_num_blocks=3, n_sub=1, halves=1)
    expected = dst.copy()
    expected[:, 1] = src[:, 4]
    swap_cache_blocks(src, dst, swap_pairs, row_elems=24)
    assert dst.tobytes() == expected.tobytes()
    paged = rng.standard_normal((2, 3, 1, 4, 6)).astype(np.float32)
    before = paged.tobytes()
    with pytest.raises(ValueError, match=r"dst_cache.shape\[0\]"):
        swap_cache_blocks(src, paged, swap_pairs, row_elems=24)
    assert paged.tobytes() == before
