"""Launch, frameworks, logical cores, NKI version switch, environment and threads."""

from __future__ import annotations

import threading
import warnings

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from nki_sim.current import use_nki_version
from nki_sim.errors import DeviceRequiredError
from sim_nki_util import load, nisa, nki, nl, out_of, sb


def _double(x):
    t = load(x)
    r = sb(x.shape, x.dtype)
    nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=2.0)
    return out_of(r)


def test_numpy_torch_and_entry_points():
    torch = pytest.importorskip("torch")
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    k = nki.jit(_double)
    np.testing.assert_array_equal(k(x), 2 * x)
    np.testing.assert_array_equal(nki.simulate(k)(x), 2 * x)
    np.testing.assert_array_equal(nki.simulator.simulate_kernel(_double, (x,), {}, 1), 2 * x)
    tx = torch.arange(16, dtype=torch.bfloat16).reshape(4, 4)
    r = k(tx)
    assert isinstance(r, torch.Tensor) and r.dtype == torch.bfloat16
    assert torch.equal(r, tx * 2)


def test_torch_input_written_in_place():
    torch = pytest.importorskip("torch")
    cache = torch.zeros((4, 4), dtype=torch.float32)
    v = torch.ones((2, 4), dtype=torch.float32)

    @nki.jit
    def k(cache, v):
        nisa.dma_copy(dst=cache[1:3], src=load(v))
        return cache

    r = k(cache, v)
    assert r is cache and float(cache.sum()) == 8.0 and float(cache[0].sum()) == 0.0


def _halves(x):
    """Each logical core doubles its half of the rows into one shared output."""
    o = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    c, n = nl.program_id(0), nl.num_programs(0)
    h = x.shape[0] // n
    t = load(x[c * h:(c + 1) * h])
    r = sb(t.shape, t.dtype)
    nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=o[c * h:(c + 1) * h], src=r)
    return o


def test_lnc2_two_cores_over_shared_hbm(monkeypatch):
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    k = nki.jit(_halves)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with nki_sim.tracing() as tr:
            r = k[2](x)
    np.testing.assert_array_equal(r, 2 * x)
    assert [e.program_id for e in tr.events] == [(0,)] * 3 + [(1,)] * 3
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    np.testing.assert_array_equal(k(x), 2 * x)
    with pytest.raises(SyntaxError, match=r"configured with LNC=1, but neuronx-cc is using LNC=2"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            k[1](x)
    with pytest.raises(TypeError, match="not an SPMD grid"):
        k[1, 2]


def test_sendrecv_exchanges_tiles():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    @nki.jit
    def k(x):
        c = nl.program_id(0)
        mine, theirs = load(x[c:c + 1]), sb((1, 4))
        nki.lnc.sendrecv(src=mine, dst=theirs, send_to_rank=1 - c, recv_from_rank=1 - c)
        o = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o[c:c + 1], src=theirs)
        return o

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        r = k[2](x)
    np.testing.assert_array_equal(r, x[::-1])


def test_target_override_and_device(monkeypatch):
    x = np.ones((4, 4), np.float32)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen2")

    @nki.jit
    def ver(x):
        return nisa.get_nc_version()

    with pytest.warns(UserWarning, match="AWS does not support"):
        assert ver(x) == nisa.nc_version.gen2
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    assert ver(x) == nisa.nc_version.gen3
    monkeypatch.setenv("NKI_SIMULATOR", "0")
    with pytest.raises(DeviceRequiredError):
        ver(x)


def _fori_copy(blocks, ids):
    """Runtime block copy: ``out[j] = blocks[ids[0, j]]`` through scalar loads in a fori_loop."""
    out = nl.ndarray((ids.shape[1],) + blocks.shape[1:], blocks.dtype, buffer=nl.shared_hbm)
    ti = load(ids)
    F = blocks.shape[1]

    def body(j):
        t = sb((1, F), blocks.dtype)
        nisa.dma_copy(dst=t, src=blocks.ap([[F, 1], [1, F]], offset=0, scalar_offset=_col(ti, j),
                                           indirect_dim=0), dge_mode=nisa.dge_mode.hwdge)
        nisa.dma_copy(dst=out.ap([[F, 1], [1, F]], offset=0, scalar_offset=j, indirect_dim=0), src=t,
                      dge_mode=nisa.dge_mode.hwdge)
    nl.fori_loop(0, ids.shape[1], body)
    return out


def _col(ti, j):
    return ti.ap([[ti.shape[1], 1], [1, 1]], offset=0, scalar_offset=j, indirect_dim=1)


def test_version_switch():
    blocks = np.arange(24, dtype=np.float32).reshape(6, 4)
    ids = np.array([[5, 0, 3]], np.int32)
    seen = []

    def probe(j):
        seen.append(type(j).__name__)

    @nki.jit
    def loop(x):
        nl.fori_loop(0, 1, probe)
        return nl.num_programs(0)

    for v, name in (("0.6", "VirtualRegister"), ("0.7", "NkiScalar"), ("0.8", "NkiScalar")):
        with use_nki_version(v):
            loop(blocks)
            assert seen[-1] == name
            np.testing.assert_array_equal(nki.jit(_fori_copy)(blocks, ids), blocks[[5, 0, 3]])
    with use_nki_version("0.6"):
        assert hasattr(nl, "dynamic_range") and not hasattr(nisa, "scalar_load")
        assert not hasattr(nl, "if_else") and not hasattr(nki, "lnc") and hasattr(nisa, "sendrecv")
    with use_nki_version("0.7"):
        assert hasattr(nisa, "scalar_load") and not hasattr(nl, "dynamic_range")
    assert hasattr(nl, "if_else") and hasattr(nki, "lnc") and not hasattr(nisa, "sendrecv")

    @nki.jit
    def regs(x):
        r = nisa.register_alloc(3)
        return r.value

    with use_nki_version("0.7"), warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert regs(blocks) == 3
    with pytest.warns(DeprecationWarning, match="deprecated in NKI 0.8"):
        regs(blocks)


def test_scalars_and_if_else():
    x = np.array([[7]], np.int32)

    @nki.jit
    def k(x):
        s = nisa.scalar_load(load(x))
        with pytest.raises(TypeError, match="Python control flow"):
            bool(s > 3)
        o = sb((1, 1), nl.int32)
        nl.if_else(s > 3, lambda: nisa.memset(dst=o, value=1), lambda: nisa.memset(dst=o, value=0))
        return out_of(o), (s * 2 + 1).value

    o, v = k(x)
    assert int(o[0, 0]) == 1 and v == 15


def test_threads_keep_their_own_version_and_results():
    x = np.arange(64, dtype=np.float32).reshape(8, 8).astype(ml_dtypes.bfloat16)
    ref = nki.jit(_double)(x)
    out, errs = {}, []

    def worker(i):
        try:
            with use_nki_version("0.6" if i % 2 else "0.8"):
                with nki_sim.tracing() as tr:
                    out[i] = (nki.jit(_double)(x), len(tr.events), hasattr(nl, "if_else"))
        except Exception as e:           # noqa: BLE001
            errs.append(e)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs
    for i, (r, n, has) in out.items():
        np.testing.assert_array_equal(r, ref)
        assert n == 3 and has == (i % 2 == 0)


def test_precise_fp_switch(monkeypatch):
    x = (np.arange(16, dtype=np.float32).reshape(4, 4) / 3).astype(np.float32)

    @nki.jit
    def k(x):
        t = sb((4, 4), nl.bfloat16)
        nisa.dma_copy(dst=t, src=x)
        r = sb((4, 4), nl.float32)
        nisa.tensor_copy(dst=r, src=t)
        return out_of(r), out_of(t)

    r, t = k(x)
    np.testing.assert_array_equal(r, x.astype(ml_dtypes.bfloat16).astype(np.float32))
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    r0, t0 = k(x)
    np.testing.assert_array_equal(r0, x)                   # fp32 storage: no bf16 rounding
    assert t0.dtype == ml_dtypes.bfloat16


def test_instructions_return_handles_with_depends_on():
    @nki.jit
    def k(x):
        t = sb((4, 4))
        a = nisa.dma_copy(dst=t, src=x)
        b = nisa.memset(dst=sb((4, 4)), value=0.0, name="zero")
        assert isinstance(a, nisa.NkiInstruction) and b.depends_on(a) is b and b.name == "zero"
        return out_of(t)

    x = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(k(x), x)


def _ro(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


@nki.jit
def _scale_into(x, out_arg):
    """out_arg[...] = 3 * x (an argument written in place); returns a fresh 2 * x output."""
    t = load(x)
    r = sb(x.shape, x.dtype)
    nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=3.0)
    nisa.dma_copy(dst=out_arg, src=r)
    return _double(x)


@nki.jit
def _write_bits(x, dst):
    """dst (8, 8) int32 receives x's bits through a float32 dtype view of dst."""
    nisa.dma_copy(dst=dst.view(nl.float32), src=load(x))
    return dst


def test_read_only_inputs_just_work():
    x = _ro(np.arange(16, dtype=np.float32).reshape(4, 4))
    np.testing.assert_array_equal(nki.simulate(nki.jit(_double))(x), 2 * x)
    np.testing.assert_array_equal(nki.jit(_double)(x), 2 * x)
    assert not x.flags.writeable                       # the caller's array is untouched
    np.testing.assert_array_equal(x, np.arange(16, dtype=np.float32).reshape(4, 4))
    # a read-only array the kernel only reads, next to a written writable one
    out_arg = np.zeros((4, 4), np.float32)
    np.testing.assert_array_equal(nki.simulate(_scale_into)(x, out_arg), 2 * x)
    np.testing.assert_array_equal(out_arg, 3 * x)


def test_read_only_written_argument_is_a_clear_error():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    out_arg = _ro(np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"kernel argument 'out_arg' is written by the kernel, but "
                                         r"the array passed is read-only"):
        nki.simulate(_scale_into)(x, out_arg)
    assert not out_arg.any()


def test_read_only_argument_written_through_a_dtype_view_is_an_error():
    x = np.arange(64, dtype=np.float32).reshape(8, 8) + 0.5
    dst = np.zeros((8, 8), np.int32)
    r = nki.simulate(_write_bits)(x, dst)               # must-pass twin: a writable destination
    assert r is dst
    np.testing.assert_array_equal(dst, x.view(np.int32))
    with pytest.raises(ValueError, match="kernel argument 'dst' is written by the kernel"):
        nki.simulate(_write_bits)(x, _ro(np.zeros((8, 8), np.int32)))


def _plus_optional(x, bias=None):
    """x + bias when an optional tensor is given (None: x), as kernels with Optional inputs."""
    t = load(x)
    if bias is not None:
        b = load(bias)
        nisa.tensor_tensor(dst=t, data1=t, data2=b, op=nl.add)
    return out_of(t)


def test_none_kernel_arguments_are_plain_values():
    # an Optional tensor input left None (default, keyword or positional) reaches the kernel as
    # None on every entry point; a given one is a tensor (the must-fail twin: not None)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    k = nki.jit(_plus_optional)
    for out in (k(x), k(x, None), k(x, bias=None), nki.simulate(k)(x, bias=None),
                nki.simulator.simulate_kernel(k, (x,), {"bias": None}, 1)):
        np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(k(x, bias=np.ones_like(x)), x + 1)
    seen = []

    @nki.jit
    def probe(x, bias=None):
        seen.append(bias)
        return out_of(load(x))

    probe(x, bias=None)
    probe(x, bias=x)
    assert seen[0] is None and seen[1] is not None and tuple(seen[1].shape) == (4, 4)
