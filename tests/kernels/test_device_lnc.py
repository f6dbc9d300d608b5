"""The LNC a launch uses on a device (``nki_kernels.toolchain.Api.lnc`` with no simulator target):
neuronx-cc refuses a kernel configured for another LNC than its own (error EVRF066), and a kernel
launched without one is configured for 1 while neuronx-cc compiles trn2 / trn3 at 2 by default.
So with nothing set the current API launches at 2; ``NEURON_LOGICAL_NC_CONFIG`` or the
``--lnc`` of ``NEURON_CC_FLAGS`` choose otherwise, and the two must agree. The device branch of
``Api.launch`` is exercised on the simulator's kernel objects (no device here)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import nki_sim
from nki_kernels import toolchain

DEVICE = {name: toolchain.Api(name, False, None) for name in ("nki", "legacy")}


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(toolchain.LNC_ENV, raising=False)
    monkeypatch.delenv(toolchain.CC_FLAGS_ENV, raising=False)
    return monkeypatch


def test_nothing_set_launches_at_the_compilers_default(clean_env):
    assert DEVICE["nki"].lnc(None, 8) == 2                            # must-pass: not 1
    assert DEVICE["nki"].lnc(None, 1, item_split=True) == 2           # the scheduled kernel's parts
    assert DEVICE["nki"].lnc(None, 3, odd_heads=True) == 2              # the dense kernel
    assert DEVICE["legacy"].lnc(None, 8) is None                      # the legacy grid decides
    with pytest.raises(NotImplementedError, match=r"cannot split a launch over 3 KV head\(s\).*"
                                                  r"set NEURON_LOGICAL_NC_CONFIG=1"):
        DEVICE["nki"].lnc(None, 3)                                    # must-fail: no split


@pytest.mark.parametrize("flags, want", [
    ("--lnc=1", 1), ("--lnc 1", 1), ("-O2 --logical-nc-config 2", 2),
    ("--logical-nc-config=1 --verbose", 1), ("--lnc=2 --lnc=1", 1), ("-O1", 2)])
def test_the_compiler_flags_set_the_lnc(clean_env, flags, want):
    clean_env.setenv(toolchain.CC_FLAGS_ENV, flags)
    assert DEVICE["nki"].lnc(None, 8) == want
    set_by_flags = "--lnc" in flags or "--logical-nc-config" in flags
    assert DEVICE["legacy"].lnc(None, 8) == (want if set_by_flags else None)


def test_the_environment_and_the_flags_must_agree(clean_env):
    clean_env.setenv(toolchain.LNC_ENV, "2")
    clean_env.setenv(toolchain.CC_FLAGS_ENV, "--lnc=2")
    assert DEVICE["nki"].lnc(None, 8) == 2                            # must-pass
    clean_env.setenv(toolchain.CC_FLAGS_ENV, "--lnc=1")
    with pytest.raises(ValueError, match=r"NEURON_LOGICAL_NC_CONFIG='2', but NEURON_CC_FLAGS makes "
                                         r"neuronx-cc compile at LNC 1.*EVRF066"):
        DEVICE["nki"].lnc(None, 8)                                    # must-fail
    clean_env.delenv(toolchain.LNC_ENV)
    with pytest.raises(ValueError, match=r"lnc=2, but NEURON_CC_FLAGS"):
        DEVICE["nki"].lnc(2, 8)
    clean_env.setenv(toolchain.CC_FLAGS_ENV, "--lnc=4")
    with pytest.raises(ValueError, match=r"the --lnc of NEURON_CC_FLAGS must be 1 or 2; got '4'"):
        DEVICE["nki"].lnc(None, 8)


def test_the_device_launch_brackets_the_compilers_lnc(clean_env, batch_factory,
                                                      build_kernel_inputs):
    # no environment variable: the kernel is launched as kernel[2] (here on the simulator's kernel
    # object, which checks the bracket against the environment as neuronx-cc does; the bracket is
    # deprecated from NKI 0.7, so setting NEURON_LOGICAL_NC_CONFIG avoids the warning)
    from nki_kernels.dense.flash_paged_attention import flash_paged_attention

    b = batch_factory(71, [2, 1], [300, 90], H=4, Hkv=2, d=16, block_size=16)
    _, inputs = build_kernel_inputs(b, large_tile_size=512)
    kwargs = dict(softmax_scale=0.25, mixed_precision=True, LARGE_TILE_SZ=512)
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace, pytest.warns(
            DeprecationWarning, match=r"kernel\[lnc\] is being deprecated"):
        out = DEVICE["nki"].launch(flash_paged_attention, inputs, kwargs, num_kv_heads=2,
                                   device=True)
    assert {e.program_id[0] for e in trace.events} == {0, 1}
    clean_env.setenv(toolchain.LNC_ENV, "1")
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
        one = DEVICE["nki"].launch(flash_paged_attention, inputs, kwargs, num_kv_heads=2,
                                   device=True)
    assert {e.program_id[0] for e in trace.events} == {0}
    np.testing.assert_array_equal(np.asarray(out), np.asarray(one))


def test_a_cache_kernel_launches_at_the_compilers_lnc_too(clean_env, rng):
    # the cache kernels have no head grid (num_kv_heads=None): on the current API they launch at
    # the compiler's LNC like the attention kernels -- kernel(...) alone would be LNC 1, which
    # neuronx-cc refuses at its default 2 (EVRF066) -- and the two cores split the rows
    from host.cache.cache_ops import cache_write_row_index
    from nki_kernels.cache.kv_cache_update import kv_cache_update

    T, Hkv, d, N, B = 300, 2, 8, 40, 16
    key = rng.standard_normal((T, Hkv, d)).astype(np.float32)
    slots = rng.permutation(N * B)[:T]
    rows = cache_write_row_index(slots, num_blocks=N, num_kv_heads=Hkv, block_size=B)
    want = np.zeros((2, N, Hkv, B, d), np.float32)
    want[0, slots // B, :, slots % B] = key
    want[1, slots // B, :, slots % B] = -key
    for env, cores in ((None, {0, 1}), ("1", {0})):
        if env:
            clean_env.setenv(toolchain.LNC_ENV, env)
        cache = np.zeros_like(want)
        with nki_sim.use_target("trn2"), nki_sim.tracing() as trace, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)        # kernel[2] (NKI 0.7+)
            DEVICE["nki"].launch(kv_cache_update, (key, -key, cache, rows), {}, num_kv_heads=None,
                                 device=True)
        assert {e.program_id[0] for e in trace.events} == cores                  # must-pass
        assert cache.tobytes() == want.tobytes()
    clean_env.setenv(toolchain.CC_FLAGS_ENV, "--lnc=2")
    with pytest.raises(ValueError, match="EVRF066"):                             # must-fail
        DEVICE["nki"].launch(kv_cache_update, (key, -key, np.zeros_like(want), rows), {},
                             num_kv_heads=None, device=True)


def test_an_argument_cannot_overrule_the_compilers_lnc_on_a_device(clean_env):
    # neuronx-cc compiles at NEURON_LOGICAL_NC_CONFIG, else its default (2 on trn2 / trn3): an
    # lnc argument that differs would build a kernel the compiler refuses (EVRF066)
    with pytest.raises(ValueError, match=r"lnc=1, but neuronx-cc's default on trn2 / trn3 makes "
                                         r"neuronx-cc compile at LNC 2.*EVRF066"):
        DEVICE["nki"].lnc(1, 8)                                       # must-fail: nothing set
    clean_env.setenv(toolchain.LNC_ENV, "2")
    with pytest.raises(ValueError, match=r"lnc=1, but NEURON_LOGICAL_NC_CONFIG makes neuronx-cc "
                                         r"compile at LNC 2"):
        DEVICE["nki"].lnc(1, 8)                                       # must-fail: the variable
    assert DEVICE["nki"].lnc(2, 8) == 2                               # must-pass: they agree
    clean_env.setenv(toolchain.LNC_ENV, "1")
    assert DEVICE["nki"].lnc(1, 8) == 1 and DEVICE["nki"].lnc(None, 8) == 1
    clean_env.delenv(toolchain.LNC_ENV)
    assert DEVICE["legacy"].lnc(1, 8) == 1                            # legacy: no LNC check


def test_the_legacy_style_grid_call_runs_the_current_api_where_it_is_installed(
        clean_env, batch_factory, build_kernel_inputs, monkeypatch):
    # vLLM calls flash_paged_attention[1, n_kv_heads](**kwargs); on SDK 2.34 (the real current
    # nki, no legacy namespace) that must launch the current API at the compiler's LNC
    from nki_kernels.dense.flash_paged_attention import flash_paged_attention

    b = batch_factory(72, [2, 1], [300, 90], H=4, Hkv=2, d=16, block_size=16)
    _, inputs = build_kernel_inputs(b, large_tile_size=512)
    kwargs = dict(softmax_scale=0.25, mixed_precision=True, LARGE_TILE_SZ=512)
    clean_env.setenv(toolchain.LNC_ENV, "2")
    with nki_sim.use_target("trn2"):
        want = DEVICE["nki"].launch(flash_paged_attention, inputs, kwargs, num_kv_heads=2,
                                    device=True)
        monkeypatch.setattr(toolchain, "resolve_api", lambda api=None, target=None: DEVICE["nki"])
        with nki_sim.tracing() as trace:
            got = flash_paged_attention[1, 2](*inputs, **kwargs)             # must-pass
        assert {e.program_id[0] for e in trace.events} == {0, 1}
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        with pytest.raises(ValueError, match=r"must be \[1, n_kv_heads\] of ints"):
            flash_paged_attention[2, 2]                                       # must-fail
    monkeypatch.undo()
    assert type(flash_paged_attention[1, 2]).__name__ == "GridLaunch"        # legacy otherwise
