"""Hardware checks, each with a near-identical must-pass case."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from nki_sim import errors as E

from test_core_helpers import f32, nisa, nl, run


def _alloc(x, *, shape, buffer, dtype=np.float32):
    t = nl.zeros(shape, dtype, buffer=buffer)
    out = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(t[0:1, 0:1], dtype=nl.float32))
    return out


@pytest.mark.parametrize("buf", ["sbuf", "psum"])
def test_partition_limit(buf):
    x = np.zeros((1, 1), np.float32)
    b = getattr(nl, buf)
    run(_alloc, x, shape=(128, 4), buffer=b)
    with pytest.raises(E.PartitionLimitError, match="number of partitions 129 exceed architecture limitation of 128"):
        run(_alloc, x, shape=(129, 4), buffer=b)


def test_psum_tile_must_fit_one_bank():
    x = np.zeros((1, 1), np.float32)
    run(_alloc, x, shape=(128, 512), buffer=nl.psum)
    with pytest.raises(E.SizeLimitError, match="2048 bytes"):
        run(_alloc, x, shape=(128, 513), buffer=nl.psum)
    run(_alloc, x, shape=(128, 1024), buffer=nl.psum, dtype=np.int16)
    with pytest.raises(E.SizeLimitError):
        run(_alloc, x, shape=(128, 1025), buffer=nl.psum, dtype=np.int16)


def test_onchip_tensors_need_rank_two():
    x = np.zeros((1, 1), np.float32)
    with pytest.raises(E.NkiCompileError, match="Insufficient rank"):
        run(_alloc, x, shape=(128,), buffer=nl.sbuf)


def _mm(a, b, *, api="nc", a_in_psum=False):
    at = nl.load(a)
    bt = nl.load(b)
    if a_in_psum:
        p = nl.ndarray(at.shape, nl.float32, buffer=nl.psum)
        p[...] = at
        at = p
    r = nisa.nc_matmul(at, bt) if api == "nc" else nl.matmul(at, bt, transpose_x=True)
    out = nl.ndarray(r.shape, nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(r))
    return out


@pytest.mark.parametrize("api", ["nc", "nl"])
@pytest.mark.parametrize("k,m,n,ok,what", [
    (128, 128, 512, True, ""),
    (129, 128, 512, False, r"number of partitions 129 exceed"),   # K > 128 cannot even be an SBUF tile
    (128, 129, 512, False, r"dimension 1 .* exceed architecture limitation of 128"),
    (128, 128, 513, False, r"dimension 1 .* exceed architecture limitation of 512"),
])
def test_matmul_limits(rng, api, k, m, n, ok, what):
    a, b = f32(rng, k, m), f32(rng, k, n)
    if ok:
        out = run(_mm, a, b, api=api)
        np.testing.assert_allclose(out, a.astype(np.float64).T @ b, rtol=1e-4, atol=1e-3)
    else:
        with pytest.raises((E.SizeLimitError, E.PartitionLimitError), match=what):
            run(_mm, a, b, api=api)


def test_matmul_contraction_mismatch(rng):
    with pytest.raises(E.PartitionMismatchError, match="contraction"):
        run(_mm, f32(rng, 64, 8), f32(rng, 32, 8))


def test_tensor_engine_reads_sbuf_only(rng):
    a, b = f32(rng, 32, 8), f32(rng, 32, 8)
    run(_mm, a, b)
    with pytest.raises(E.MemorySpaceError, match="'stationary' of 'nc_matmul' to be in address space 'sbuf', but got a tile in 'psum'"):
        run(_mm, a, b, a_in_psum=True)


def test_tensor_engine_writes_psum(rng):
    def k(a):
        r = nisa.nc_transpose(nl.load(a))
        assert r.buffer == "psum"
        m = nisa.nc_matmul(nl.load(a), nl.load(a))
        assert m.buffer == "psum" and m.dtype == np.float32
        out = nl.ndarray(r.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(r))
        return out
    a = f32(rng, 16, 8)
    assert np.array_equal(run(k, a), a.T)


def _load_from(x, *, onchip):
    t = nl.load(x)
    src = t if onchip else x
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(src))
    return out


def test_load_source_must_be_hbm(rng):
    x = f32(rng, 4, 4)
    with pytest.raises(E.MemorySpaceError, match="Expected operand 'src' of 'load' to be in address space 'hbm', but got a tile in 'sbuf' instead."):
        run(_load_from, x, onchip=True)
    run(_load_from, x, onchip=False)


def _gpsimd(x, *, psum, engine):
    t = nl.load(x)
    if psum:
        p = nl.ndarray(t.shape, t.dtype, buffer=nl.psum)
        p[...] = t
        t = p
    r = nisa.tensor_copy(t, engine=engine)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, r)
    return out


def test_gpsimd_never_touches_psum(rng):
    x = f32(rng, 8, 8)
    assert np.array_equal(run(_gpsimd, x, psum=False, engine=nisa.gpsimd_engine), x)
    assert np.array_equal(run(_gpsimd, x, psum=True, engine=nisa.vector_engine), x)
    with pytest.raises(E.MemorySpaceError, match="GpSimd"):
        run(_gpsimd, x, psum=True, engine=nisa.gpsimd_engine)


def _compute_on_hbm(x):
    return nl.exp(x)


def test_compute_on_hbm_tensor_is_rejected(rng):
    with pytest.raises(E.MemorySpaceError, match="in 'hbm' instead"):
        run(_compute_on_hbm, f32(rng, 4, 4))


def _tt(a, b):
    r = nisa.tensor_tensor(nl.load(a), nl.load(b), np.add)
    out = nl.ndarray(r.shape, r.dtype, buffer=nl.shared_hbm)
    nl.store(out, r)
    return out


def test_tensor_tensor_partition_mismatch(rng):
    run(_tt, f32(rng, 128, 512), f32(rng, 128, 512))
    with pytest.raises(E.PartitionMismatchError, match=r"mismatch in parameters \(data1\[128, 512\], data2\[1, 512\]\) of 'tensor_tensor'"):
        run(_tt, f32(rng, 128, 512), f32(rng, 1, 512))


def _dma_t(x):
    r = nisa.dma_transpose(nl.load(x))
    out = nl.ndarray(r.shape, r.dtype, buffer=nl.shared_hbm)
    nl.store(out, r)
    return out


def test_dma_transpose_is_gen3_only(rng):
    x = f32(rng, 32, 16)
    with nki_sim.use_target("trn2"):
        assert np.array_equal(run(_dma_t, x), x.T)
    with nki_sim.use_target("trn1"), pytest.raises(E.TargetError, match="NeuronCore-v3"):
        run(_dma_t, x)


def test_get_nc_version_follows_target(monkeypatch):
    def k(x):
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        nl.store(out, int(nisa.get_nc_version()))
        return out
    x = np.zeros((1, 1), np.float32)
    assert run(k, x)[0, 0] == int(nisa.nc_version.gen3)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen2")
    assert run(k, x)[0, 0] == int(nisa.nc_version.gen2)
    from nki_sim.legacy import nki_api as nki
    assert nki.simulate_kernel(nki.jit(k, platform_target="trn2"), x)[0, 0] == int(nisa.nc_version.gen3)
    with pytest.raises(ValueError, match="platform_target"):
        nki.jit(k, platform_target="trn9")


def test_not_emulated_names_raise_not_implemented():
    with pytest.raises(NotImplementedError, match="nisa.max8 is not emulated"):
        nisa.max8
    with pytest.raises(NotImplementedError, match="nl.rms_norm is not emulated"):
        nl.rms_norm
    with pytest.raises(AttributeError):
        nl.definitely_not_an_nki_name
    assert not hasattr(nisa, "max8")            # also an AttributeError for hasattr()


def test_device_modes_need_a_device(rng):
    from nki_sim.legacy import nki_api as nki

    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out
    x = f32(rng, 2, 2)
    for deco in (nki.baremetal, nki.benchmark, nki.profile):
        kk = deco(k)
        with pytest.raises(RuntimeError, match="requires a Neuron device"):
            kk(x)
        assert np.array_equal(nki.simulate_kernel(kk, x), x)     # simulation still works
    with pytest.raises(RuntimeError, match="requires a Neuron device"):
        nki.jit(k, mode="baremetal")[1](x)


def test_api_outside_kernel_is_rejected():
    with pytest.raises(E.NkiCompileError, match="err_nki_api_outside_of_nki_kernel"):
        nl.zeros((128, 1), nl.float32)


def _assign_results(a, *, mm_dst, iota_dst):
    at = nl.load(a)
    mm = nl.ndarray((a.shape[1], a.shape[1]), nl.float32, buffer=getattr(nl, mm_dst))
    mm[...] = nisa.nc_matmul(at, at)
    io = nl.ndarray((4, 8), nl.int32, buffer=getattr(nl, iota_dst))
    io[...] = nisa.iota(nl.arange(8)[None, :] + nl.arange(4)[:, None], dtype=nl.int32)
    out = nl.ndarray(mm.shape, nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(mm))
    return out


def test_instruction_results_land_in_their_engines_memories(rng):
    a = f32(rng, 16, 8)
    out = run(_assign_results, a, mm_dst="psum", iota_dst="sbuf")
    np.testing.assert_allclose(out, a.astype(np.float64).T @ a, rtol=1e-5, atol=1e-5)
    with pytest.raises(E.MemorySpaceError, match="Tensor Engine writes PSUM only"):
        run(_assign_results, a, mm_dst="sbuf", iota_dst="sbuf")
    with pytest.raises(E.MemorySpaceError, match="GpSimd engine cannot access PSUM"):
        run(_assign_results, a, mm_dst="psum", iota_dst="psum")


def _block_operand(x, *, index_block):
    t = nl.zeros((2, nl.par_dim(8), 4), nl.float32)
    r = nl.exp(t[1] if index_block else t)
    out = nl.ndarray((8, 4), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, r)
    return out


def test_compute_operand_must_be_a_tile():
    x = np.zeros((1, 1), np.float32)
    with nki_sim.configure(block_dims="allow"):
        assert np.all(run(_block_operand, x, index_block=True) == 1.0)
        with pytest.raises(E.NkiCompileError, match="err_failed_to_infer_tile_from_local_tensor"):
            run(_block_operand, x, index_block=False)


def _act_scale(x, *, scale_kind):
    t = nl.load(x)
    scale = {"float": 0.5, "tile": nl.full((8, 1), 0.5, nl.float32),
             "bf16_tile": nl.full((8, 1), 0.5, nl.bfloat16), "wide": nl.full((8, 2), 0.5, nl.float32)}[scale_kind]
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nisa.activation(np.exp, t, scale=scale))
    return out


def test_activation_scale_is_scalar_or_fp32_vector(rng):
    x = f32(rng, 8, 4)
    for kind in ("float", "tile"):
        np.testing.assert_allclose(run(_act_scale, x, scale_kind=kind), np.exp(0.5 * x.astype(np.float64)),
                                   rtol=1e-6)
    with pytest.raises(E.NkiCompileError, match="err_activation_scale_invalid_type"):
        run(_act_scale, x, scale_kind="bf16_tile")
    with pytest.raises(E.NkiCompileError, match="err_activation_scale_scalar_or_vector"):
        run(_act_scale, x, scale_kind="wide")


def _store_from(x, *, via):
    t = nl.load(x)
    p = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
    p[...] = nisa.nc_transpose(nisa.nc_transpose(t))
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, p if via == "psum" else nl.copy(p))
    return out


def test_store_from_psum_needs_sdk_2_26(rng):
    x = f32(rng, 8, 8)
    assert np.array_equal(run(_store_from, x, via="sbuf"), x)
    with pytest.raises(E.MemorySpaceError, match="got a tile in 'psum' instead"):
        run(_store_from, x, via="psum")
    with nki_sim.configure(allow_psum_store=True):
        assert np.array_equal(run(_store_from, x, via="psum"), x)


def _mm_into(a, *, dtype, acc):
    at = nl.load(a)
    ps = nl.zeros((a.shape[1], a.shape[1]), dtype, buffer=nl.psum)
    if acc:
        ps += nisa.nc_matmul(at, at)
    else:
        ps[...] = nl.matmul(at, at, transpose_x=True)
    out = nl.ndarray(ps.shape, nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(ps, dtype=nl.float32))
    return out


@pytest.mark.parametrize("acc", [True, False])
def test_matmul_psum_destination_must_be_fp32(rng, acc):
    import ml_dtypes
    a = f32(rng, 16, 8)
    np.testing.assert_allclose(run(_mm_into, a, dtype=nl.float32, acc=acc), a.T.astype(np.float64) @ a,
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(E.DtypeError, match="must be float32"):
        run(_mm_into, a, dtype=ml_dtypes.bfloat16, acc=acc)


def _pe_transpose(x, *, psum_dtype):
    t = nl.load(x)
    p = nl.ndarray((x.shape[1], x.shape[0]), psum_dtype, buffer=nl.psum)
    p[...] = nisa.nc_transpose(t)
    out = nl.ndarray(p.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(p, dtype=x.dtype))
    return out


def test_pe_transpose_psum_dtype_follows_the_generation(rng):
    import warnings
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    x = rng.standard_normal((16, 8)).astype(bf16)
    with nki_sim.use_target("trn1"):
        assert np.array_equal(run(_pe_transpose, x, psum_dtype=nl.float32), x.T)
        with pytest.raises(E.DtypeError, match="float32 on NeuronCore-v2"):
            run(_pe_transpose, x, psum_dtype=bf16)
    with nki_sim.use_target("trn2"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert np.array_equal(run(_pe_transpose, x, psum_dtype=bf16), x.T)
        with pytest.warns(RuntimeWarning, match="must match the input dtype"):
            run(_pe_transpose, x, psum_dtype=nl.float32)
