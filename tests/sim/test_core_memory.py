"""Memory model: poison + written bitmap, uninitialized reads, masked writes, parameters, live bytes."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from nki_sim import errors as E

from test_core_helpers import f32, nisa, nl, nt, run


def _read_unwritten(x, *, mode):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype)
    t[:, 0:4] = nl.load(x[:, 0:4])
    if mode == "all":
        nl.store(out, t)
    else:
        nl.store(out[:, 0:4], t[:, 0:4])
    return out


def test_reading_written_part_passes(rng):
    x = f32(rng, 8, 8)
    with nki_sim.configure(uninitialized="raise"):
        out = run(_read_unwritten, x, mode="part")
    assert np.array_equal(out[:, :4], x[:, :4])
    assert np.isnan(out[:, 4:]).all()          # unwritten output keeps its NaN poison


def test_reading_unwritten_memory_raises(rng):
    with pytest.raises(E.UninitializedReadError, match=r"never-written.*first at index \[0, 4\]"):
        run(_read_unwritten, f32(rng, 8, 8), mode="all")


def test_uninitialized_read_can_warn_or_be_ignored(rng):
    x = f32(rng, 8, 8)
    with nki_sim.configure(uninitialized="warn"), pytest.warns(RuntimeWarning, match="never-written"):
        out = run(_read_unwritten, x, mode="all")
    assert np.isnan(out[:, 4:]).all()
    with nki_sim.configure(uninitialized="ignore"):
        run(_read_unwritten, x, mode="all")


def test_configure_rejects_bad_values():
    with pytest.raises(ValueError, match="uninitialized"):
        with nki_sim.configure(uninitialized="maybe"):
            pass
    with pytest.raises(ValueError, match="unknown switch"):
        with nki_sim.configure(nope=1):
            pass


def _masked_load(x, *, n):
    out = nl.ndarray((128, x.shape[1]), x.dtype, buffer=nl.shared_hbm)
    t = nl.full((128, x.shape[1]), -7.0, x.dtype)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    t[i_p, i_f] = nl.load(x[i_p, i_f], mask=(i_p < n))     # rows >= n are out of bounds: masked
    nl.store(out, t)
    return out


def test_masked_statement_keeps_rest_of_destination(rng):
    x = f32(rng, 100, 6)
    out = run(_masked_load, x, n=100)
    assert np.array_equal(out[:100], x)
    assert np.all(out[100:] == -7.0)


def test_unmasked_out_of_bounds_access_is_static_error(rng):
    with pytest.raises(E.AccessOutOfBoundError, match=r"dimension 0: index range \[0, 127\] exceed dimension size of 100"):
        run(_masked_load, f32(rng, 100, 6), n=128)


def _writes_input(x):
    nl.store(x[0:2, :], nl.zeros((2, x.shape[1]), x.dtype))
    return x


def _writes_mutable(x: nt.mutable_tensor):
    nl.store(x[0:2, :], nl.zeros((2, x.shape[1]), x.dtype))
    return x


def _writes_mutable_not_returned(x: nt.mutable_tensor):
    nl.store(x[0:2, :], nl.zeros((2, x.shape[1]), x.dtype))
    out = nl.ndarray((1, 1), x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.zeros((1, 1), x.dtype))
    return out


def test_inputs_are_immutable(rng):
    x = f32(rng, 4, 4)
    before = x.copy()
    with pytest.raises(E.ImmutableParameterError, match="err_cannot_update_immutable_parameter"):
        run(_writes_input, x)
    assert np.array_equal(x, before)


def test_mutable_input_written_back_in_place(rng):
    x = f32(rng, 4, 4)
    before = x.copy()
    out = run(_writes_mutable, x)
    assert out is x
    assert np.all(x[:2] == 0) and np.array_equal(x[2:], before[2:])


def test_mutable_noncontiguous_input_written_back(rng):
    base = f32(rng, 4, 8)
    x = base[:, ::2]                        # non-contiguous caller view
    run(_writes_mutable, x)
    assert np.all(base[:2, ::2] == 0) and np.all(base[:2, 1::2] != 0)


def test_mutable_input_must_be_returned(rng):
    with pytest.raises(E.KernelSignatureError, match="err_mutable_parameter_not_returned"):
        run(_writes_mutable_not_returned, f32(rng, 4, 4))


def _never_written(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    return out


def test_output_never_written_is_an_error(rng):
    with pytest.raises(E.KernelSignatureError, match="err_tensor_output_not_written_to"):
        run(_never_written, f32(rng, 2, 2))


def test_float64_arguments_are_rejected():
    with pytest.raises(ValueError, match="argument 'x'.*float64"):
        run(_never_written, np.zeros((2, 2)))


def _live(x):
    out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((128, 1024), nl.float32)            # 4 KiB / partition
    a[...] = 0.0
    del a                                              # dropped: no longer live
    b = nl.zeros((128, 256), nl.bfloat16)              # 512 B / partition
    p = nl.zeros((128, 512), nl.float32, buffer=nl.psum)   # 2 KiB / partition PSUM
    nl.store(out, nl.copy(b[:, 0:4], dtype=nl.float32))
    del p
    return out


def test_peak_live_bytes_per_partition():
    with nki_sim.tracing() as tr:
        run(_live, np.zeros((1, 1), np.float32))
    s = tr.summary()
    assert s["peak_sbuf_bytes_per_partition"] == 4096
    assert s["peak_psum_bytes_per_partition"] == 2048
    assert s["sbuf_capacity_bytes_per_partition"] == 212984


def _two_buffers(x):
    out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
    a = nl.zeros((128, 1024), nl.float32)
    b = nl.zeros((128, 1024), nl.float32)              # both live: 8 KiB
    nl.store(out, nl.add(a[:, 0:4], b[:, 0:4]))
    return out


def test_peak_counts_simultaneously_live_tiles():
    with nki_sim.tracing() as tr:
        run(_two_buffers, np.zeros((1, 1), np.float32))
    assert tr.summary()["peak_sbuf_bytes_per_partition"] >= 8192


def _legacy_out_arg(a, b):
    nl.store(b, nl.multiply(nl.load(a), 2.0))


def test_legacy_inplace_output_argument_convention(rng):
    a = f32(rng, 4, 4)
    b = np.zeros_like(a)
    with pytest.raises(E.ImmutableParameterError):
        run(_legacy_out_arg, a, b)
    with nki_sim.configure(legacy_inplace_outputs=True):
        assert run(_legacy_out_arg, a, b) is None
    assert np.array_equal(b, 2 * a)


def _taint(x, *, n, store):
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    t = nl.load(x[i_p, i_f], mask=(i_p < n))          # rows >= n never written
    e = nl.exp(t)                                      # computed on garbage rows: they stay unwritten
    s = nl.sum(e, axis=1)                              # per-row reduction keeps the row mask
    out = nl.ndarray((128, x.shape[1] + 1), nl.float32, buffer=nl.shared_hbm)
    if store == "masked":
        nl.store(out[i_p, i_f], e, mask=(i_p < n))
        nl.store(out[i_p, x.shape[1] + 0 * i_f[:, 0:1]], s, mask=(i_p < n))
    elif store == "full":
        nl.store(out[:, 0:x.shape[1]], e)
    else:
        m = nisa.nc_matmul(nl.copy(e[:, 0:4], dtype=nl.bfloat16), nl.copy(e[:, 0:4], dtype=nl.bfloat16))
        nl.store(out[0:4, 0:4], nl.copy(m))
    return out


def test_poison_propagates_through_elementwise_ops(rng):
    x = f32(rng, 100, 6)
    out = run(_taint, x, n=100, store="masked")
    np.testing.assert_allclose(out[:100, :6], np.exp(x.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(out[:100, 6], np.exp(x.astype(np.float64)).sum(1), rtol=1e-5)
    with pytest.raises(E.UninitializedReadError, match="'store' reads 168 never-written"):
        run(_taint, x, n=100, store="full")
    with pytest.raises(E.UninitializedReadError, match="nc_matmul"):
        run(_taint, x, n=100, store="matmul")


def _free_axis_mask(x, *, n):
    i_p = nl.arange(x.shape[0])[:, None]
    i_f = nl.arange(x.shape[1])[None, :]
    t = nl.full(x.shape, -1.0, x.dtype)
    t[i_p, i_f] = nl.load(x[i_p, i_f], mask=(i_f < n))     # bitmap broadcast from a (1, F) mask
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def test_mask_on_the_free_axis_only(rng):
    """Regression: a bitmap copied from a broadcast (1, F) mask came out F-ordered and was misread."""
    x = f32(rng, 3, 4)
    out = run(_free_axis_mask, x, n=1)
    assert np.array_equal(out[:, :1], x[:, :1]) and np.all(out[:, 1:] == -1.0)


def _one_after_another(x, n_tiles, overlap):
    """n_tiles (128, 1000) fp32 tiles (4000 B per partition each), all held in a Python list; each
    is written and read before the next is allocated, and with ``overlap`` read again at the end."""
    out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
    held = []
    for _ in range(n_tiles):
        t = nl.ndarray((128, 1000), nl.float32)
        t[...] = 1.0
        held.append((t, nl.copy(t[:, 0:1])))
    acc = held[-1][1]
    if overlap:
        for t, _ in held:
            acc = nl.maximum(acc, t[:, 0:1])
    nl.store(out, acc)
    return out


@pytest.mark.parametrize("overlap, over", [(False, False), (True, True)])
def test_live_bytes_end_at_the_last_access_not_at_the_last_reference(overlap, over):
    # 50 tiles of 4000 B: 200000 B per partition if all were live, above trn1's usable 180224 B
    with nki_sim.use_target("trn1"), nki_sim.tracing() as tr:
        run(_one_after_another, np.zeros((1, 1), np.float32), n_tiles=50, overlap=overlap)
    s = tr.summary()
    assert s["sbuf_over_capacity"] is over                       # must-pass / must-fail
    if not over:
        assert s["peak_sbuf_bytes_per_partition"] < 2 * 4000 + 64
    else:
        assert s["peak_sbuf_bytes_per_partition"] >= 50 * 4000


def _late_legacy_read(x, how):
    """A 100000 B / partition tile ``a`` read by ``how`` after another one, ``b``, exists (trn1
    usable: 180224 B)."""
    out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((128, 25000), nl.float32)
    a[...] = 1.0
    b = nl.ndarray((128, 25000), nl.float32)
    b[...] = 2.0
    if how == "store":
        nl.store(out, a[:, 0:1])
    elif how == "matmul":
        nl.store(out, nl.copy(nl.matmul(a[:, 0:128], b[:, 0:1], transpose_x=True)))
    else:                                  # no late read: a is dead when b is allocated
        nl.store(out, b[:, 0:1])
    return out


@pytest.mark.parametrize("how, over", [("store", True), ("matmul", True), ("none", False)])
def test_legacy_access_paths_extend_the_lifetime(how, over):
    with nki_sim.use_target("trn1"), nki_sim.tracing() as tr:
        run(_late_legacy_read, np.zeros((1, 1), np.float32), how=how)
    assert tr.summary()["sbuf_over_capacity"] is over
