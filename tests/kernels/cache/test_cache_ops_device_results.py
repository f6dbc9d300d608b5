"""The cache ops take the cache a kernel RETURNS: on a device a kernel run with NumPy arguments
returns the updated arrays instead of writing the caller's (the simulator does both). A launch
that copies its arguments stands in for that device transfer; every op must still leave the
caller's cache as NumPy's own slot indexing does."""

from __future__ import annotations

import copy

import ml_dtypes
import numpy as np
import pytest

from host import allocate_mla_cache, concat_and_cache_mla
from host._arrays import take_result
from host.cache.cache_ops import allocate_kv_caches, copy_blocks, reshape_and_cache, swap_blocks
from nki_kernels import toolchain

pytestmark = pytest.mark.simulation


@pytest.fixture
def copying_launch(monkeypatch):
    """Api.run on deep copies of its arguments: only the returned arrays carry the writes."""
    real = toolchain.Api.run
    calls = []

    def run(self, family, *args, lnc=None, **kwargs):
        calls.append(family)
        return real(self, family, *copy.deepcopy(args), lnc=lnc, **copy.deepcopy(kwargs))

    monkeypatch.setattr(toolchain.Api, "run", run)
    return calls


def test_every_cache_op_keeps_the_returned_cache(rng, copying_launch):
    N, Hkv, B, d = 10, 2, 4, 8
    key = rng.standard_normal((6, Hkv, d)).astype(np.float32)
    slots = np.array([3, 17, -1, 22, 8, 39])
    s = slots[slots >= 0]
    cache = np.zeros((2, N, Hkv, B, d), np.float32)
    reshape_and_cache(key, -key, cache, slots)
    assert (cache[0, s // B, :, s % B] == key[slots >= 0]).all()
    assert (cache[1, s // B, :, s % B] == -key[slots >= 0]).all()

    fp8 = np.zeros((2, N, Hkv, B, d), ml_dtypes.float8_e4m3fn)
    reshape_and_cache(key, key, fp8, slots, k_scale=1.0, v_scale=1.0)
    assert fp8[0, s // B, :, s % B].tobytes() == key[slots >= 0].astype(fp8.dtype).tobytes()

    pair = (np.zeros((N, B, Hkv, d), np.float32), np.zeros((N, B, Hkv, d), np.float32))
    reshape_and_cache(key, -key, pair, slots)
    assert (pair[0][s // B, s % B] == key[slots >= 0]).all() and (pair[1][s // B, s % B] == -key[slots >= 0]).all()

    shared = allocate_kv_caches(2, N, Hkv, B, d)             # one buffer: the zero-copy path
    separate = [rng.standard_normal((2, N, Hkv, B, d)).astype(np.float32) for _ in range(2)]
    for layers in (shared, separate):
        for layer in layers:
            layer[...] = rng.standard_normal(layer.shape)
        want = [layer.copy() for layer in layers]
        for w in want:
            w[:, [4, 7]] = w[:, [1, 2]]
        copy_blocks(layers, np.array([[1, 4], [2, 7]]))
        assert all(a.tobytes() == b.tobytes() for a, b in zip(layers, want))

    src = rng.standard_normal((2, N, Hkv, B, d)).astype(np.float32)
    dst = np.zeros((2, 3, Hkv, B, d), np.float32)
    swap_blocks(src, dst, np.array([[5, 0], [9, 2]]))
    assert (dst[:, 0] == src[:, 5]).all() and (dst[:, 2] == src[:, 9]).all() and (dst[:, 1] == 0).all()

    mla = allocate_mla_cache(4, 8, kv_lora_rank=16, qk_rope_head_dim=8, dtype=np.float32)
    kv_c = rng.standard_normal((3, 16)).astype(np.float32)
    k_pe = rng.standard_normal((3, 8)).astype(np.float32)
    concat_and_cache_mla(kv_c, k_pe, mla, np.array([0, 9, 30]))
    assert (mla[[0, 1, 3], [0, 1, 6], :16] == kv_c).all() and (mla[[0, 1, 3], [0, 1, 6], 16:24] == k_pe).all()
    assert len(copying_launch) == 7                          # every write went through a copy


def test_take_result_copies_only_what_it_must():
    dst = np.zeros(4, np.float32)
    take_result(dst, dst)                                    # the same memory: nothing to do
    take_result(dst, np.arange(4, dtype=np.float32))         # a returned array: copied in
    assert (dst == np.arange(4)).all()
    with pytest.raises(ValueError, match="must fit its C-contiguous destination"):
        take_result(dst, np.zeros(3, np.float32))            # must-fail: another size
    with pytest.raises(ValueError, match="contiguous: False"):
        take_result(np.zeros((4, 2), np.float32)[:, 0], np.zeros(4, np.float32))
