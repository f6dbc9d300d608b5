"""The scheduled kernel on both NKI API generations from one source (nki_kernels.ops): the same
float64 reference and tolerance table on the legacy and the current front end (trn2), garbage
safety and vectorized gathers on the current one, and API gating: each front end runs the
kernel at its API floor (legacy: Neuron SDK 2.23, the first with indirect-DMA skipping;
current: NKI 0.6, the oldest release the simulator models) and refuses what predates it."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from host.attention import paged_attention
from host.reference import paged_attention_ref

pytestmark = [pytest.mark.simulation,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
APIS = ("legacy", "nki")
BATCH = dict(query_lens=[1, 3, 150, 1], context_lens=[700, 40, 300, 1500])


def _check(batch, tol, **options):
    out = paged_attention(*batch.args(), backend="sim", large_tile_size=512, **options)
    ref = paged_attention_ref(*batch.args(), **{k: v for k, v in options.items()
                                                 if k not in ("mixed_precision",)})
    atol, rtol = tol("mixed" if options.get("mixed_precision", True) else "fp32",
                     batch.query.dtype)
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= atol + rtol * np.abs(ref)), float(err.max())
    return out


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("d, mixed", [(64, True), (64, False), (256, True)])
def test_both_apis_match_the_reference(api, d, mixed, on_api, batch_factory, tol):
    b = batch_factory(11, BATCH["query_lens"], BATCH["context_lens"], H=4, Hkv=2, d=d,
                      block_size=16)
    with on_api(api):
        _check(b, tol, mixed_precision=mixed)


@pytest.mark.parametrize("options", [
    dict(sliding_window=300), dict(logits_soft_cap=20.0, alibi_slopes=np.linspace(0.1, 0.8, 4)),
    dict(sinks=np.linspace(-1.0, 1.0, 4))], ids=["window", "softcap_alibi", "sinks"])
def test_variants_on_the_current_api(options, on_api, batch_factory, tol):
    b = batch_factory(12, BATCH["query_lens"], BATCH["context_lens"], H=4, Hkv=2, d=32,
                      block_size=16)
    with on_api("nki"):
        _check(b, tol, **options)


def test_fp8_cache_on_the_current_api(on_api, batch_factory, tol):
    import ml_dtypes

    b = batch_factory(13, BATCH["query_lens"], BATCH["context_lens"], H=4, Hkv=2, d=32,
                      block_size=16, dtype=ml_dtypes.bfloat16)
    k_scale, v_scale = 0.5, 0.25
    fp8 = np.stack([b.kv_cache[0].astype(np.float32) / k_scale,
                    b.kv_cache[1].astype(np.float32) / v_scale]).astype(ml_dtypes.float8_e4m3fn)
    deq = np.stack([fp8[0].astype(np.float32) * k_scale,
                    fp8[1].astype(np.float32) * v_scale]).astype(b.kv_cache.dtype)
    with on_api("nki"):
        out = paged_attention(b.query, b.key, b.value, fp8, b.block_tables, b.query_lens,
                              b.context_lens, backend="sim", large_tile_size=512,
                              k_scale=k_scale, v_scale=v_scale)
    ref = paged_attention_ref(b.query, b.key, b.value, deq, b.block_tables, b.query_lens,
                              b.context_lens)
    atol, rtol = tol("mixed", b.query.dtype)
    assert np.all(np.abs(out.astype(np.float64) - ref) <= atol + rtol * np.abs(ref))


def test_garbage_where_no_query_looks_never_reaches_the_output_on_the_current_api(
        on_api, batch_factory, poison_unseen):
    # NaN in every cache slot no query may see: block tails past each context, unused blocks
    q, c, B = [1, 3, 40, 1], [50, 7, 300, 33], 16
    b = batch_factory(14, q, c, H=4, Hkv=2, d=16, block_size=B, spare_blocks=3)
    with on_api("nki"):
        clean = paged_attention(*b.args(), backend="sim", large_tile_size=512)
        dirty = poison_unseen(b)
        out = paged_attention(b.query, b.key, b.value, dirty, b.block_tables, b.query_lens,
                              b.context_lens, backend="sim", large_tile_size=512)
    assert out.tobytes() == clean.tobytes()


def test_the_apis_agree(on_api, batch_factory):
    b = batch_factory(15, BATCH["query_lens"], BATCH["context_lens"], H=4, Hkv=2, d=64,
                      block_size=32)
    outs = {}
    for api in APIS:
        with on_api(api):
            outs[api] = paged_attention(*b.args(), backend="sim", large_tile_size=512)
    assert np.abs(outs["legacy"] - outs["nki"]).max() < 1e-2


def test_current_api_moves_what_the_legacy_kernel_moves(on_api, batch_factory):
    # the same vectorized gathers and scatters (one indirect DMA of <= 128 row descriptors per
    # load, skipped rows moving nothing) and the same direct metadata loads on both front ends
    b = batch_factory(16, [1, 3, 150], [2000, 900, 40], H=4, Hkv=2, d=32, block_size=16)
    moved = {}
    for api in APIS:
        with on_api(api), nki_sim.tracing() as trace:
            paged_attention(*b.args(), backend="sim", large_tile_size=512)
        dma = [e for e in trace.events if e.engine == "dma"]
        ind = [e for e in dma if e.dma_kind == "indirect"]
        assert ind and all(len(e.descriptor_bytes) <= 128 for e in ind)
        moved[api] = (len(ind), sum(e.bytes for e in ind),
                      sorted(len(e.descriptor_bytes) for e in ind),
                      sum(e.bytes for e in dma if e.dma_kind == "direct"))
    assert moved["nki"] == moved["legacy"]


def test_legacy_front_end_runs_at_its_sdk_floor_and_refuses_older(on_api, batch_factory, tol):
    b = batch_factory(17, [1, 40], [300, 20], H=2, Hkv=1, d=16, block_size=16)
    with on_api("legacy"):
        with nki_sim.configure(sdk="2.23"):
            _check(b, tol)
        with nki_sim.configure(sdk="2.22"), pytest.raises(NotImplementedError,
                                                           match=r"SDK >= 2.23"):
            paged_attention(*b.args(), backend="sim", large_tile_size=512)


def test_current_front_end_runs_at_its_oldest_release(on_api, batch_factory, tol):
    from nki_sim.current import use_nki_version

    b = batch_factory(18, [1, 40], [300, 20], H=2, Hkv=1, d=16, block_size=16)
    with on_api("nki"), use_nki_version("0.6"):
        _check(b, tol)


def test_current_api_is_refused_on_trn1(on_api, batch_factory):
    b = batch_factory(19, [1], [30], H=2, Hkv=1, d=16, block_size=16)
    with on_api("nki", "trn1"), pytest.raises(NotImplementedError, match="trn2 / trn3 only"):
        paged_attention(*b.args(), backend="sim")


@pytest.mark.parametrize("api, target", [("legacy", "trn1"), ("legacy", "trn2"), ("nki", "trn2")])
def test_fp8_long_decode_with_the_full_phase_copies_on_vectore(api, target, on_api,
                                                               batch_factory, tol):
    # decodes over many 512-key full tiles per partial tile (sched_config.FULL_HEAVY): the
    # full phase's decode copies run on VectorE; the outputs still match the reference of the
    # dequantized cache, and the PV PSUM copies are VectorE tensor_copies there
    import ml_dtypes

    from nki_kernels.scheduled.sched_config import FULL_HEAVY

    b = batch_factory(17, [1, 1], [3000, 2600], H=4, Hkv=2, d=64, block_size=16,
                      dtype=ml_dtypes.bfloat16)
    k_scale, v_scale = 0.5, 0.25
    fp8 = np.stack([b.kv_cache[0].astype(np.float32) / k_scale,
                    b.kv_cache[1].astype(np.float32) / v_scale]).astype(ml_dtypes.float8_e4m3fn)
    deq = np.stack([fp8[0].astype(np.float32) * k_scale,
                    fp8[1].astype(np.float32) * v_scale]).astype(b.kv_cache.dtype)
    with on_api(api, target), nki_sim.tracing() as trace:
        out = paged_attention(b.query, b.key, b.value, fp8, b.block_tables, b.query_lens,
                              b.context_lens, backend="sim", large_tile_size=512,
                              k_scale=k_scale, v_scale=v_scale, lnc=1)
    ref = paged_attention_ref(b.query, b.key, b.value, deq, b.block_tables, b.query_lens,
                              b.context_lens)
    atol, rtol = tol("mixed", b.query.dtype)
    assert np.all(np.abs(out.astype(np.float64) - ref) <= atol + rtol * np.abs(ref))
    # 5 full tiles per sequence and 1 partial: FULL_HEAVY holds. The (d, rows) fp32 PV PSUM
    # copies: the full phase's on VectorE, the partial phase's left to ScalarE (pinned-engine
    # tensor_copy vs the layer's default copy)
    assert 5 >= FULL_HEAVY
    pv = [e for e in trace.events if e.src_buffer == "psum" and e.out_shape == (64, 2)]
    on_vector = [e for e in pv if e.engine == "vector" and not e.attr("engine_unspecified")]
    assert len(on_vector) >= FULL_HEAVY * (len(pv) - len(on_vector)) > 0
