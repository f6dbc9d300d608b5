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
    take_result(dst, dst, slice(None))                       # the same memory: nothing to do
    take_result(dst, np.arange(4, dtype=np.float32), [1, 3])  # a returned array: its written part
    assert (dst == [0, 1, 0, 3]).all()
    with pytest.raises(ValueError, match="must match its destination"):
        take_result(dst, np.zeros(3, np.float32), slice(None))   # must-fail: another shape


def test_concurrent_writes_to_one_cache_survive_each_others_device_round_trip(rng, monkeypatch):
    # on a device each launch works on its own copy of the cache: the copy-back must carry only
    # the rows the launch wrote, or the second thread's copy-back erases the first one's tokens
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    real = toolchain.Api.run

    def slow_copying_run(self, family, *args, lnc=None, **kwargs):
        out = real(self, family, *copy.deepcopy(args), lnc=lnc, **copy.deepcopy(kwargs))
        time.sleep(0.05)                                     # both launches hold stale copies
        return out

    monkeypatch.setattr(toolchain.Api, "run", slow_copying_run)
    Hkv, d, B, N = 2, 16, 8, 16
    cache = np.zeros((2, N, Hkv, B, d), np.float32)
    layers = allocate_kv_caches(2, N, Hkv, B, d)
    for layer in layers:
        layer[:, 9] = 5.0
    barrier = threading.Barrier(3)

    def write(t):
        barrier.wait()
        kv = np.full((32, Hkv, d), t + 1, np.float32)
        reshape_and_cache(kv, kv, cache, np.arange(t * 32, t * 32 + 32))   # blocks 4t .. 4t+3
        reshape_and_cache(kv, kv, layers[0], np.arange(t * 32, t * 32 + 32))

    def copy_on_write():
        barrier.wait()
        copy_blocks(layers, np.array([[9, 12]]))

    with ThreadPoolExecutor(3) as pool:
        for f in [pool.submit(write, 0), pool.submit(write, 1), pool.submit(copy_on_write)]:
            f.result(timeout=120)
    assert (cache[:, 0:4] == 1).all() and (cache[:, 4:8] == 2).all()
    assert (layers[0][:, 0:4] == 1).all() and (layers[0][:, 4:8] == 2).all()
    assert all((layer[:, 12] == 5).all() for layer in layers)
