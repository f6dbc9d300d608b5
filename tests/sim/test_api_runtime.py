"""Loops, SPMD grids, jit modes / entry points, inline @nki.jit helpers, targets
(trn1 / trn2 and nisa.get_nc_version branches) and ops that are not emulated."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt

import nki_sim

pytestmark = pytest.mark.simulation


# --------------------------------------------------------------------------- loops
@nki.jit
def loop_kinds_k(x, *, kind, start, stop, step):
    """out row-block i = x row-block i * (i + 1) for i in <kind>(start, stop, step); other
    blocks zero."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    zero = nl.zeros((128, x.shape[1]), dtype=nl.float32)
    for b in nl.affine_range(x.shape[0] // 128):
        nl.store(out[nl.ds(b * 128, 128), :], value=zero)
    loop = range if kind == "range" else getattr(nl, kind)
    for i in loop(start, stop, step):
        tile = nl.load(x[nl.ds(i * 128, 128), :])
        nl.store(out[nl.ds(i * 128, 128), :], value=nl.multiply(tile, i + 1.0))
    return out


@pytest.mark.parametrize("kind", ["affine_range", "sequential_range", "static_range", "range"])
def test_loop_kinds_iterate_like_range(rng, kind):
    x = rng.standard_normal((6 * 128, 8)).astype(np.float32)
    out = nki.simulate_kernel(loop_kinds_k, x, kind=kind, start=1, stop=6, step=2)
    ref = np.zeros_like(x, dtype=np.float64)
    for i in range(1, 6, 2):
        ref[i * 128:(i + 1) * 128] = x[i * 128:(i + 1) * 128] * (i + 1)
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_loop_kinds_differ_from_a_wrong_range(rng):
    # guards the test above: a loop that ran range(6) would give a different answer
    x = rng.standard_normal((6 * 128, 8)).astype(np.float32)
    out = nki.simulate_kernel(loop_kinds_k, x, kind="affine_range", start=0, stop=6, step=1)
    assert out[128:256].any()
    wrong = nki.simulate_kernel(loop_kinds_k, x, kind="affine_range", start=1, stop=6, step=2)
    assert not np.array_equal(out, wrong)


# --------------------------------------------------------------------------- grids
def _grid_rows_body(x, *, scale):
    """Program (i,) of a 1-D grid scales row-block i of x by scale * (i + 1)."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    i = nl.program_id(axis=0)
    assert nl.program_ndim() == 1
    tile = nl.load(x[nl.ds(i * 128, 128), :])
    nl.store(out[nl.ds(i * 128, 128), :], value=nl.multiply(tile, scale * (i + 1)))
    return out


grid_rows_k = nki.jit(_grid_rows_body)


def test_one_dimensional_grid_with_kwargs(rng):
    x = rng.standard_normal((3 * 128, 16)).astype(np.float32)
    out = nki.simulate_kernel(grid_rows_k[3], x, scale=0.5)
    ref = x.reshape(3, 128, 16) * (0.5 * np.arange(1, 4))[:, None, None]
    np.testing.assert_allclose(out, ref.reshape(x.shape), rtol=1e-6)


def test_grid_launch_through_jit_simulation_mode(rng):
    kernel = nki.jit(_grid_rows_body, mode="simulation")
    x = rng.standard_normal((2 * 128, 16)).astype(np.float32)
    out = kernel[2](x, scale=2.0)
    np.testing.assert_allclose(out, (x.reshape(2, 128, 16) * np.array([2.0, 4.0])[:, None, None])
                               .reshape(x.shape), rtol=1e-6)


def test_grid_program_ndim_assertion_fails_on_2d_grid(rng):
    x = rng.standard_normal((2 * 128, 16)).astype(np.float32)
    with pytest.raises(AssertionError):
        nki.simulate_kernel(grid_rows_k[2, 1], x, scale=1.0)


# --------------------------------------------------------------------------- jit modes
def _double_body(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(x), 2.0))
    return out


def test_jit_simulation_mode_direct_call(rng):
    x = rng.standard_normal((32, 8)).astype(np.float32)
    np.testing.assert_array_equal(nki.jit(_double_body, mode="simulation")(x), 2 * x)


def test_jit_decorator_with_arguments_and_simulate_kernel(rng):
    kernel = nki.jit(mode="simulation")(_double_body)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(kernel, x), 2 * x)


def test_jit_auto_mode_with_numpy_simulates(rng, sim_only):
    x = rng.standard_normal((32, 8)).astype(np.float32)
    np.testing.assert_array_equal(nki.jit(_double_body)(x), 2 * x)


@pytest.mark.parametrize("launch", ["jit-baremetal", "jit-benchmark", "jit-profile", "baremetal",
                                    "benchmark"])
def test_device_modes_require_a_neuron_device(rng, launch, sim_only, rejects):
    x = rng.standard_normal((32, 8)).astype(np.float32)
    with rejects(RuntimeError, match=r"(?i)neuron device"):
        if launch == "jit-baremetal":
            nki.jit(_double_body, mode="baremetal")(x)
        elif launch == "jit-benchmark":
            nki.jit(_double_body, mode="benchmark")(x)
        elif launch == "jit-profile":
            nki.jit(_double_body, mode="profile")(x)
        elif launch == "baremetal":
            nki.baremetal(_double_body)(x)
        else:
            nki.benchmark(warmup=1, iters=1)(_double_body)(x)


@nki.jit
def _inline_helper(tile, factor):
    """An @nki.jit function called from inside a kernel acts as an inline call."""
    return nl.multiply(tile, factor)


@nki.jit
def calls_helper_k(x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=_inline_helper(nl.load(x), 3.0))
    return out


def test_jit_helper_called_inside_a_kernel_is_inlined(rng):
    x = rng.standard_normal((64, 8)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(calls_helper_k, x), 3 * x.astype(np.float64), rtol=1e-6)


# --------------------------------------------------------------------------- targets
def _version_body(x):
    """Writes 3 into every element if the target is gen3 (trn2), 2 if gen2 (trn1)."""
    out = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    gen = 3 if nisa.get_nc_version() == nisa.nc_version.gen3 else 2
    nl.store(out, value=nl.full(x.shape, gen, dtype=nl.int32))
    return out


version_k = nki.jit(_version_body)


@pytest.mark.parametrize("name,gen", [("trn1", 2), ("trn2", 3)])
def test_get_nc_version_follows_use_target(target, name, gen):
    with target(name):
        out = nki.simulate_kernel(version_k, np.zeros((4, 4), np.float32))
    np.testing.assert_array_equal(out, gen)


@pytest.mark.parametrize("name,gen", [("trn1", 2), ("trn2", 3)])
def test_get_nc_version_follows_platform_target(sim_only, name, gen):
    kernel = nki.jit(_version_body, mode="simulation", platform_target=name)
    np.testing.assert_array_equal(kernel(np.zeros((4, 4), np.float32)), gen)


@pytest.mark.parametrize("env,gen", [("trn1", 2), ("gen2", 2), ("trn2", 3), ("gen3", 3)])
def test_get_nc_version_follows_env_override(sim_only, monkeypatch, env, gen):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", env)
    np.testing.assert_array_equal(nki.simulate_kernel(version_k, np.zeros((4, 4), np.float32)), gen)


def test_default_target_is_trn2(sim_only, monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    assert nki_sim.get_target().name == "trn2"
    np.testing.assert_array_equal(nki.simulate_kernel(version_k, np.zeros((4, 4), np.float32)), 3)


def test_target_objects_hold_the_documented_limits(sim_only):
    trn1, trn2 = nki_sim.TARGETS["trn1"], nki_sim.TARGETS["trn2"]
    assert (trn1.nc_version, trn2.nc_version) == ("gen2", "gen3")
    for t in (trn1, trn2):
        assert (t.pmax, t.psum_fmax, t.gemm_stationary_fmax, t.gemm_moving_fmax) == (128, 512, 128, 512)
        assert t.psum_bank_bytes == 2048 and t.psum_banks == 8
    assert trn1.sbuf_bytes_per_partition == 192 * 1024
    assert trn2.sbuf_bytes_per_partition == 224 * 1024
    with pytest.raises(AttributeError):
        trn1.pmax = 64                    # frozen dataclass


@pytest.mark.parametrize("name", ["trn1", "trn2"])
def test_transpose_kernel_is_exact_on_both_targets(tutorial, rng, target, name):
    # the gen3 branch uses nisa.dma_transpose, the gen2 branch nc_transpose through fp32 PSUM
    x = rng.standard_normal((128, 128)).astype(ml_dtypes.bfloat16)
    with target(name), nki_sim.tracing() as trace:
        out = nki.simulate_kernel(tutorial.transpose_by_target, x)
    np.testing.assert_array_equal(out.view(np.uint16), x.T.view(np.uint16))
    ops = {e.op for e in trace.events}
    assert ("dma_transpose" in ops) == (name == "trn2")
    assert ("nc_transpose" in ops) == (name == "trn1")


@pytest.mark.parametrize("name", ["trn1", "trn2"])
def test_softmax_numerics_identical_on_both_targets(tutorial, rng, target, name):
    x = (rng.standard_normal((128, 200)) * 3).astype(np.float32)
    with target(name):
        out = nki.simulate_kernel(tutorial.row_softmax, x)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- not emulated
@nki.jit
def stream_shuffle_k(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.nc_stream_shuffle(src=tile, dst=dst, shuffle_mask=list(range(32)))
    nl.store(out, value=dst)
    return out


def test_op_not_emulated_raises_not_implemented_naming_it(rng, sim_only, rejects):
    x = rng.standard_normal((32, 8)).astype(np.float32)
    with rejects(NotImplementedError, match="nc_stream_shuffle"):
        nki.simulate_kernel(stream_shuffle_k, x)


@nki.jit
def program_id_axis_k(x, *, axis):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    pid = nl.program_id(axis)
    nl.store(out, value=nl.multiply(nl.load(x), pid + 1.0))
    return out


def test_program_id_axis_beyond_the_grid_rank_fails(rng, rejects):
    x = rng.standard_normal((8, 4)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(program_id_axis_k[1, 2], x, axis=1), 2 * x)
    with rejects(Exception, match=r"(?i)axis"):
        nki.simulate_kernel(program_id_axis_k[2], x, axis=1)


@pytest.mark.parametrize("wrap", ["baremetal", "jit-baremetal", "benchmark"])
def test_simulate_kernel_accepts_device_decorated_kernels(rng, wrap):
    # nki-samples simulate baremetal-decorated kernels: simulate_kernel(baremetal(k)[grid], ...)
    x = rng.standard_normal((2 * 128, 16)).astype(np.float32)
    if wrap == "baremetal":
        kernel = nki.baremetal(_grid_rows_body)
    elif wrap == "jit-baremetal":
        kernel = nki.jit(_grid_rows_body, mode="baremetal")
    else:
        kernel = nki.benchmark(warmup=1, iters=1)(_grid_rows_body)
    out = nki.simulate_kernel(kernel[2], x, scale=1.0)
    ref = x.reshape(2, 128, 16) * np.array([1.0, 2.0])[:, None, None]
    np.testing.assert_allclose(out, ref.reshape(x.shape), rtol=1e-6)


def test_explicit_target_choices_beat_the_env_override(sim_only, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    x = np.zeros((4, 4), np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(version_k, x), 2)
    kernel = nki.jit(_version_body, mode="simulation", platform_target="trn2")
    np.testing.assert_array_equal(nki.simulate_kernel(kernel[1], x), 3)
    with nki_sim.use_target("trn2"):
        np.testing.assert_array_equal(nki.simulate_kernel(version_k, x), 3)


def test_unknown_target_name_is_rejected(sim_only, monkeypatch, rejects):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with rejects(ValueError, match="trn9"):
        nki.simulate_kernel(version_k, np.zeros((4, 4), np.float32))


@nki.jit(mode="trace")
def _trace_mode_helper(tile, factor):
    """Sub-kernel decorated as AWS flash attention does: @nki.jit(mode='trace')."""
    return nl.multiply(tile, factor)


@nki.jit
def calls_trace_helper_k(x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=_trace_mode_helper(nl.load(x), -2.0))
    return out


def test_trace_mode_sub_kernel_is_inlined(rng):
    x = rng.standard_normal((64, 8)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(calls_trace_helper_k, x), -2 * x.astype(np.float64),
                               rtol=1e-6)


@nki.jit
def _bump_rows(cache: nt.mutable_tensor, x):
    """cache[0:128] = x + 1 (cache written in place, returned); x only read."""
    nl.store(cache[0:128, :], value=nl.add(nl.load(x), 1.0))
    return cache


def test_read_only_arrays_as_input_and_as_written_argument(rng, sim_only, rejects):
    x = rng.standard_normal((128, 8)).astype(np.float32)
    x.flags.writeable = False                          # a read-only input just works
    cache = np.zeros((256, 8), np.float32)
    assert nki.simulate_kernel(_bump_rows, cache, x) is cache
    np.testing.assert_array_equal(cache[:128], (x.astype(np.float64) + 1.0).astype(np.float32))
    ro = np.zeros((256, 8), np.float32)
    ro.flags.writeable = False                         # ... a written one is an error naming it
    with rejects(ValueError, match="kernel argument 'cache' is written by the kernel, but the "
                                   "array passed is read-only"):
        nki.simulate_kernel(_bump_rows, ro, x)


# --------------------------------------------------------------------------- None arguments
@nki.jit
def plus_optional_k(x, bias=None):
    """x + bias when an optional tensor is given (None: x), as kernels with Optional inputs."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    if bias is not None:
        t = nl.add(t, nl.load(bias))
    nl.store(out, value=t)
    return out


def test_none_kernel_arguments_are_plain_values():
    # an Optional tensor input left None (default, keyword or positional) reaches the kernel as
    # None through simulate_kernel, grid launches and plain calls; a given one is a tensor
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    for out in (nki.simulate_kernel(plus_optional_k, x), nki.simulate_kernel(plus_optional_k, x, None),
                nki.simulate_kernel(plus_optional_k[1, 2], x, bias=None), plus_optional_k(x, bias=None)):
        np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(nki.simulate_kernel(plus_optional_k, x, bias=np.ones_like(x)),
                                  x + 1)
    seen = []

    @nki.jit
    def probe(x, bias=None):
        seen.append(bias)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x))
        return out

    nki.simulate_kernel(probe, x, bias=None)
    nki.simulate_kernel(probe, x, bias=x)
    assert seen[0] is None and seen[1] is not None and tuple(seen[1].shape) == (4, 4)
