"""Thread safety of nki_sim: per-thread kernel state, targets, switches and traces.

Semantics (nki_sim/README.md, "Threads"): ``use_target`` / ``configure`` / ``tracing`` blocks
act on the calling thread only; process-wide defaults (``nki_sim.config.<name> = ...`` outside
any block, env variables) apply to every thread.  Kernels simulated in several threads at once
give bit-identical results and traces to the same runs made one after another.
"""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from nki_sim import blas
from nki_sim import errors as E
from nki_sim.legacy import isa as nisa
from nki_sim.legacy import language as nl
from nki_sim.legacy import nki_api as nki

pytestmark = pytest.mark.simulation



def run_threads(jobs, timeout=120):
    """Run ``jobs`` (name -> callable) in one thread each, started together; returns
    name -> result, re-raising the first exception of any thread."""
    barrier = threading.Barrier(len(jobs))
    results, errors = {}, {}

    def body(name, fn):
        try:
            barrier.wait()
            results[name] = fn()
        except BaseException as e:         # noqa: BLE001 - handed to the main thread
            errors[name] = e

    threads = [threading.Thread(target=body, args=(n, f), name=n) for n, f in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish"
    if errors:
        name, e = next(iter(errors.items()))
        raise AssertionError(f"thread {name} failed: {type(e).__name__}: {e}") from e
    return results


# --------------------------------------------------------------------------- kernels used
@nki.jit
def _scaled_copy(x, *, factor):
    """out = x * factor, one 128-row tile per affine iteration (fp32)."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.arange(128)[:, None], nl.arange(x.shape[1])[None, :]
    for t in nl.affine_range(x.shape[0] // 128):
        tile = nl.load(x[t * 128 + i_p, i_f])
        nl.store(out[t * 128 + i_p, i_f], nl.multiply(tile, factor))
    return out


@nki.jit
def _reads_unwritten(x):
    """Stores a tile whose second half was never written (an UninitializedReadError)."""
    out = nl.ndarray((128, 8), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 8), x.dtype)
    t[:, 0:4] = nl.load(x[:, 0:4])
    nl.store(out, t)
    return out


def _flash_case(seed):
    """A small mixed batch (prefill chunk + decode), H=4, Hkv=2, d=32, block size 16, bf16."""
    rng = np.random.default_rng(seed)
    qlens, clens, H, Hkv, d, B = np.array([5, 1]), np.array([40, 130]), 4, 2, 32, 16
    nblk = -(-clens // B)
    N = int(nblk.sum()) + 2
    perm = rng.permutation(N)
    bt = np.full((2, int(nblk.max())), -1, np.int32)
    bt[0, :nblk[0]], bt[1, :nblk[1]] = perm[:nblk[0]], perm[nblk[0]:nblk.sum()]
    T = int(qlens.sum())

    def u(*s):
        return rng.uniform(-1, 1, s).astype(ml_dtypes.bfloat16)
    return (u(T, H, d), u(T, Hkv, d), u(T, Hkv, d), u(2, N, Hkv, B, d), bt, qlens, clens)


def _flash_job(target, args):
    from host.attention import paged_attention

    def job():
        with nki_sim.use_target(target), nki_sim.tracing() as tr:
            out = paged_attention(*args, large_tile_size=512, backend="sim", gqa_packing=False,
                                  kernel="dense")
            assert nki_sim.get_target().name == target
        return out, tr
    return job


def _cache_job(seed):
    """reshape_and_cache on a private cache (5 tokens, 2 KV heads, d=8, 6 blocks of 4)."""
    from host.cache.cache_ops import reshape_and_cache

    def job():
        rng = np.random.default_rng(seed)
        cache = rng.standard_normal((2, 6, 2, 4, 8)).astype(np.float32)
        key = rng.standard_normal((5, 2, 8)).astype(np.float32)
        value = rng.standard_normal((5, 2, 8)).astype(np.float32)
        slots = rng.permutation(24)[:5]
        with nki_sim.use_target("trn1"), nki_sim.tracing() as tr:
            reshape_and_cache(key, value, cache, slots)
        return (cache, key, value, slots), tr
    return job


def _tutorial_job(tutorial, x, y):
    def job():
        with nki_sim.configure(sdk="2.26"), nki_sim.tracing() as tr:
            out = nki.simulate_kernel(tutorial.spmd_tensor_add[2, 1], x, y)
            assert nki_sim.config.sdk == (2, 26)
        return out, tr
    return job


def _copy_job(x, factor):
    def job():
        with nki_sim.configure(uninitialized="warn"), nki_sim.tracing() as tr:
            out = _scaled_copy(x, factor=factor)
        return out, tr
    return job


def _jobs(tutorial):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((256, 256)).astype(np.float32)      # grid [2, 1] of 128 x 256 tiles
    y = rng.standard_normal((256, 256)).astype(np.float32)
    z = rng.standard_normal((384, 32)).astype(np.float32)
    return {
        "flash_trn1": _flash_job("trn1", _flash_case(1)),
        "flash_trn2": _flash_job("trn2", _flash_case(2)),
        "reshape_and_cache": _cache_job(3),
        "tutorial_add": _tutorial_job(tutorial, x, y),
        "scaled_copy": _copy_job(z, 3.0),
    }, (x, y, z)


def _same_trace(a, b):
    return a.events == b.events and a.summary() == b.summary()


# --------------------------------------------------------------------------- concurrent runs
def test_concurrent_kernels_match_sequential_runs_bit_for_bit(tutorial, fast_switching):
    jobs, (x, y, z) = _jobs(tutorial)
    sequential = {name: fn() for name, fn in jobs.items()}
    for rep in range(2):
        concurrent = run_threads(dict(_jobs(tutorial)[0]))
        for name, (res, tr) in concurrent.items():
            seq_res, seq_tr = sequential[name]
            got = res if name != "reshape_and_cache" else res[0]
            want = seq_res if name != "reshape_and_cache" else seq_res[0]
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (name, rep)
            assert tr.events, name
            assert _same_trace(tr, seq_tr), f"{name}: trace differs from the sequential run"
    # the sequential results themselves are right (independent definitions)
    np.testing.assert_array_equal(sequential["tutorial_add"][0], x + y)
    np.testing.assert_array_equal(sequential["scaled_copy"][0], z * np.float32(3.0))
    cache0, key, value, slots = sequential["reshape_and_cache"][0]
    rng = np.random.default_rng(3)
    expect = rng.standard_normal((2, 6, 2, 4, 8)).astype(np.float32)
    for t, s in enumerate(slots.tolist()):
        expect[0, s // 4, :, s % 4, :] = key[t]
        expect[1, s // 4, :, s % 4, :] = value[t]
    np.testing.assert_array_equal(cache0, expect)
    # flash numerics against the float64 reference: tests/kernels/test_host_threads.py


def test_traces_hold_only_their_own_threads_events(tutorial, fast_switching):
    x = np.ones((256, 256), np.float32)
    seen_target = {}

    def kernel_thread(name, target):
        def job():
            with nki_sim.use_target(target), nki_sim.tracing() as tr:
                nki.simulate_kernel(tutorial.spmd_tensor_add[2, 1], x, x)
                seen_target[name] = tr.summary()["targets"]
            return tr
        return job

    def idle_thread():
        with nki_sim.tracing() as tr:
            barrier_done.wait()
        return tr

    barrier_done = threading.Event()
    jobs = {"a": kernel_thread("a", "trn1"), "b": kernel_thread("b", "trn2")}
    idle = {}
    t = threading.Thread(target=lambda: idle.setdefault("tr", idle_thread()))
    t.start()
    res = run_threads(jobs)
    barrier_done.set()
    t.join(30)
    assert idle["tr"].events == []                      # nothing of the other threads
    for name in ("a", "b"):
        assert len(res[name].events) == len(res["a"].events) > 0
        assert {e.program_id for e in res[name].events} == {(0, 0), (1, 0)}
    assert seen_target == {"a": ["trn1"], "b": ["trn2"]}
    assert [e.seq for e in res["b"].events] == list(range(len(res["b"].events)))


# --------------------------------------------------------------------------- settings per thread
def _view():
    return (nki_sim.get_target().name, nki_sim.config.sdk, nki_sim.config.uninitialized,
            hasattr(nl, "gather_flattened"), hasattr(nisa, "oob_mode"))


def test_settings_made_in_a_block_stay_in_their_thread():
    inside, release = threading.Event(), threading.Event()
    seen = {}
    mine = _view()
    assert mine[2] == "raise" and mine[1] >= (2, 23) and mine[3:] == (mine[1] >= (2, 24), True)

    def other():
        with nki_sim.use_target("trn1"), nki_sim.configure(sdk="2.21", uninitialized="ignore"), \
                nki_sim.tracing() as tr:
            seen["other"] = _view()
            inside.set()
            release.wait(30)
        seen["other_trace"] = tr

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(30)
    try:
        # the main thread sees none of the other thread's settings while its blocks are open
        assert _view() == mine
        x = np.ones((128, 8), np.float32)
        with pytest.raises(E.UninitializedReadError):      # "ignore" is the other thread's
            _reads_unwritten(x)
        _scaled_copy(np.ones((128, 4), np.float32), factor=2.0)    # not in the other trace
    finally:
        release.set()
        t.join(30)
    assert seen["other"] == ("trn1", (2, 21), "ignore", False, False)
    assert seen["other_trace"].events == []


def test_process_wide_defaults_reach_other_threads():
    old = nki_sim.config.uninitialized
    seen = {}

    def probe():
        seen["value"] = nki_sim.config.uninitialized

    try:
        nki_sim.config.uninitialized = "warn"            # outside any block: process-wide
        t = threading.Thread(target=probe)
        t.start()
        t.join(30)
    finally:
        nki_sim.config.uninitialized = old
    assert seen["value"] == "warn"
    assert nki_sim.config.uninitialized == old


def test_assignment_inside_a_block_is_undone_with_the_block():
    with nki_sim.configure(check_scope=False):
        nki_sim.config.check_scope = "changed"           # the block's own switch: scoped
        assert nki_sim.config.check_scope == "changed"
    assert nki_sim.config.check_scope is True
    with pytest.raises(AttributeError, match="no switch 'check_scop'"):
        nki_sim.config.check_scop = False


def test_an_error_in_one_thread_leaves_the_others_running(tutorial, fast_switching):
    x = np.ones((128, 8), np.float32)
    z = np.arange(512 * 16, dtype=np.float32).reshape(512, 16)

    def failing():
        with pytest.raises(E.UninitializedReadError, match="never-written"):
            _reads_unwritten(x)
        return "raised"

    res = run_threads({"bad": failing, "good": lambda: _scaled_copy(z, factor=0.5),
                       "bad2": failing})
    assert res["bad"] == res["bad2"] == "raised"
    np.testing.assert_array_equal(res["good"], z * np.float32(0.5))


def test_blas_thread_count_is_restored_after_concurrent_runs(fast_switching):
    api = blas._find()
    if not api:
        pytest.skip("no OpenBLAS thread-count API in this NumPy build")
    setter, getter = api
    before = getter()
    z = np.ones((256, 16), np.float32)
    run_threads({str(i): (lambda: _scaled_copy(z, factor=1.0)) for i in range(3)})
    assert getter() == before
