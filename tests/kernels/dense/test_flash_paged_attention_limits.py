"""One test per vLLM limitation the kernel removes (notes §1.7), plus odd shapes.

vLLM's kernel: (1) needs seq_q % 128 == 0 and, above 512, seq_q % 512 == 0; (3) needs at least
one context tile and is wrong without context; (4) leaves garbage in fully masked (padding)
rows; (5) relies on padded block-table entries being valid ids; head sizes / ratios / block
sizes were limited to the tested sets. Each test below would fail on that behaviour.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.attention import flash_attn_varlen_nkifunc
from nki_kernels.toolchain import nki
from nki_kernels.dense.flash_paged_attention import flash_paged_attention

pytestmark = pytest.mark.simulation


def test_query_count_above_512_not_multiple_of_512(batch_factory, check_reference):
    # T = 700 -> Qpad = 768: vLLM asserts seq_q % 512 == 0 above 512 (and needs pow2 padding).
    q, c = [300, 1, 250, 149], [40, 600, 0, 77]
    batch = batch_factory(1, q, c, H=2, Hkv=1, d=16, block_size=16)
    check_reference(batch, mixed_precision=False, large_tile_size=512)


def test_query_count_not_multiple_of_128(batch_factory, check_reference):
    # T = 5 -> Qpad = 128 (vLLM computes nothing for seq_q < 128 and needs % 128 == 0).
    batch = batch_factory(2, [3, 1, 1], [5, 130, 1], H=4, Hkv=2, d=8, block_size=8)
    check_reference(batch, mixed_precision=True, large_tile_size=1024)


def test_batch_without_any_context(batch_factory, check_reference):
    # All context_lens == 0: the plan's single context tile is entirely masked. vLLM adds a
    # phantom exp(-m) term here; the result must equal plain causal attention.
    batch = batch_factory(3, [17, 1, 40], [0, 0, 0], H=4, Hkv=1, d=32, block_size=32)
    check_reference(batch, mixed_precision=False, large_tile_size=2048)


def test_all_masked_context_tiles_change_nothing(batch_factory, build_kernel_inputs):
    # Padding the active block table with extra, fully masked tiles must leave every output
    # bit-identical (the tiles contribute exactly zero and rescale by exactly one).
    batch = batch_factory(4, [5, 1, 9], [300, 1000, 20], H=2, Hkv=1, d=16, block_size=16)
    plan, base = build_kernel_inputs(batch, large_tile_size=512)
    _, padded = build_kernel_inputs(batch, large_tile_size=512,
                                    pad_blocks_to=plan.num_active_blocks + 64)
    out0 = flash_attn_varlen_nkifunc(*base, LARGE_TILE_SZ=512, mixed_precision=False, backend="sim")
    out1 = flash_attn_varlen_nkifunc(*padded, LARGE_TILE_SZ=512, mixed_precision=False, backend="sim")
    assert padded[4].shape[0] == base[4].shape[0] + 64
    np.testing.assert_array_equal(out1, out0)


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "fp32"])
def test_padding_rows_are_exactly_zero(batch_factory, mixed, build_kernel_inputs):
    # Rows past the real tokens see nothing (all-False mask rows): output must be exactly 0,
    # not vLLM's mean of V weighted by the -9984 floor.
    batch = batch_factory(5, [3, 1, 2], [70, 5, 0], H=3, Hkv=1, d=8, block_size=4)
    plan, inputs = build_kernel_inputs(batch, large_tile_size=512)
    out = flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, mixed_precision=mixed, backend="sim")
    T = plan.num_queries
    assert out.shape == (1, 3, plan.padded_queries, 8)
    assert np.all(out[0, :, T:, :] == 0)
    assert np.all(np.abs(out[0, :, :T, :]).max(axis=-1) > 0)


def test_padded_block_table_entries_stay_inside_a_tight_cache(batch_factory, check_reference):
    # The cache holds exactly the used blocks (no spare block); the active table is padded
    # with 0 (a valid id) up to the tile, and the simulator raises on any out-of-cache row.
    batch = batch_factory(6, [4, 1], [33, 9], H=2, Hkv=2, d=8, block_size=2, spare_blocks=0)
    assert batch.kv_cache.shape[1] == 17 + 5
    check_reference(batch, mixed_precision=False, large_tile_size=512)


def test_out_of_cache_block_id_is_detected(batch_factory, build_kernel_inputs):
    # Must-fail counterpart of the test above: an id past the cache is an indirect-DMA error.
    batch = batch_factory(7, [2], [20], H=1, Hkv=1, d=8, block_size=4, spare_blocks=0)
    _, inputs = build_kernel_inputs(batch, large_tile_size=512)
    bt = inputs[4].copy()
    bt[1] = batch.kv_cache.shape[1]                    # one past the last block
    # (called directly: the host wrappers would reject the id before launching)
    with pytest.raises(IndexError):
        nki.simulate_kernel(flash_paged_attention[1, 1], *inputs[:4], bt, inputs[5],
                            mixed_precision=False, LARGE_TILE_SZ=512)


@pytest.mark.parametrize("H, Hkv, d", [(3, 1, 1), (6, 2, 5), (10, 5, 33), (7, 7, 128)],
                         ids=["d1_ratio3", "d5_ratio3", "d33_ratio2", "d128_mha7"])
def test_any_head_size_and_head_ratio(H, Hkv, d, batch_factory, check_reference):
    batch = batch_factory(8 + d, [6, 1], [19, 44], H=H, Hkv=Hkv, d=d, block_size=8)
    check_reference(batch, mixed_precision=False, large_tile_size=512)


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "bf16"])
@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_bf16_inputs_on_both_targets(target, mixed, batch_factory, check_reference):
    # bf16 end to end: gen3 transposes P by DMA, gen2 through PSUM (both 2-byte paths).
    batch = batch_factory(9, [20, 1, 1], [100, 260, 3], H=4, Hkv=2, d=64, block_size=16,
                          dtype=ml_dtypes.bfloat16)
    with nki_sim.use_target(target):
        check_reference(batch, mixed_precision=mixed, large_tile_size=1024)


def test_query_groups_beyond_the_state_budget(batch_factory, check_reference, monkeypatch,
                                              build_kernel_inputs):
    # A query batch whose online-softmax state exceeds the SBUF budget is processed in groups of
    # Q tiles (KV re-read per group). Forcing one Q tile per group must give bit-identical
    # results to the single-group run, and both must match the reference.
    import nki_kernels.sbuf_plan as sbuf_plan

    batch = batch_factory(10, [150, 1, 140], [33, 500, 0], H=4, Hkv=2, d=16, block_size=16)
    plan, inputs = build_kernel_inputs(batch, large_tile_size=512)
    assert plan.padded_queries == 384
    one = flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, mixed_precision=True, backend="sim")
    monkeypatch.setattr(sbuf_plan, "STATE_BUDGET_BYTES", 1)
    with nki_sim.tracing() as trace:
        grouped = flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, mixed_precision=True,
                                            backend="sim")
    # 3 groups x 2 KV heads x n_tiles x (K + V), one load per tile (L = 128)
    assert trace.summary()["dma_indirect_instructions"] == 3 * 2 * plan.num_large_tiles * 2
    np.testing.assert_array_equal(grouped, one)
    check_reference(batch, mixed_precision=True, large_tile_size=512)


def test_empty_block_table_means_no_context(batch_factory, build_kernel_inputs):
    # The kernel itself also accepts num_active_blocks = 0 (mask (Qpad, Qpad)): same result as the
    # host plan's single all-masked context tile, bit for bit.
    batch = batch_factory(11, [9, 1, 30], [0, 0, 0], H=4, Hkv=2, d=16, block_size=8)
    plan, inputs = build_kernel_inputs(batch, large_tile_size=512)
    q, k, v, cache, bt, mask = inputs
    ctx = plan.context_kv_len
    with_tile = flash_attn_varlen_nkifunc(*inputs, LARGE_TILE_SZ=512, mixed_precision=False,
                                          backend="sim")
    empty = flash_attn_varlen_nkifunc(q, k, v, cache, bt[:0], np.ascontiguousarray(mask[:, ctx:]),
                                      LARGE_TILE_SZ=512, mixed_precision=False, backend="sim")
    np.testing.assert_array_equal(empty, with_tile)


def test_large_logits_and_custom_scale(batch_factory, check_reference):
    # Scores of several thousand (inputs x8, scale 1.0): the running max keeps exp() in range and
    # the finite masking sentinels never overflow. fp32 mode matches the reference; bf16 matmul
    # inputs cannot (a 2**-8 relative error on a score of 4000 moves it by ~16), so mixed mode is
    # only required to stay finite and inside the convex hull of the values.
    from host.attention import paged_attention

    batch = batch_factory(12, [7, 1, 2], [90, 400, 33], H=4, Hkv=2, d=64, block_size=16)
    for a in (batch.query, batch.key, batch.kv_cache):
        a *= 8.0
    check_reference(batch, mixed_precision=False, large_tile_size=512, softmax_scale=1.0)
    out = paged_attention(*batch.args(), softmax_scale=1.0, mixed_precision=True,
                          large_tile_size=512, backend="sim")
    assert np.isfinite(out).all()
    vmax = max(np.abs(batch.value).max(), np.abs(batch.kv_cache[1]).max())
    assert np.abs(out).max() <= vmax * (1 + 2 ** -7)


@nki.jit
def _pe_transpose_kernel(query, key, value, kv_cache, block_tables, mask, softmax_scale=None,
                         mixed_precision=True, LARGE_TILE_SZ=2048):
    from nki_kernels.toolchain import nl
    from nki_kernels.dense.flash_paged_attention import flash_paged_attention_body, output_shape

    from nki_kernels.ops import legacy

    o = nl.ndarray(output_shape(query), dtype=query.dtype, buffer=nl.shared_hbm)
    return flash_paged_attention_body(legacy, query, key, value, kv_cache, block_tables, mask,
                                      softmax_scale, mixed_precision, LARGE_TILE_SZ, out=o,
                                      p_transpose="pe")


def test_pe_transpose_path_on_trn2_matches_dma_path(batch_factory, build_kernel_inputs):
    # The benchmark knob p_transpose="pe" (TensorE transposes of P on gen3) gives the same
    # result as the default DMA transposes (both exact copies of bf16 P).
    batch = batch_factory(13, [20, 1], [300, 700], H=4, Hkv=2, d=32, block_size=32)
    plan, inputs = build_kernel_inputs(batch, large_tile_size=1024)
    with nki_sim.use_target("trn2"):
        dma = nki.simulate_kernel(flash_paged_attention[1, 2], *inputs, LARGE_TILE_SZ=1024)
        with nki_sim.tracing() as trace:
            pe = nki.simulate_kernel(_pe_transpose_kernel[1, 2], *inputs, LARGE_TILE_SZ=1024)
    assert not any(e.op == "dma_transpose" for e in trace.events)
    np.testing.assert_array_equal(pe, dma)
    # must-fail: DMA transposes are gen3-only
    with nki_sim.use_target("trn1"), pytest.raises(ValueError, match="p_transpose must be"):
        nki.simulate_kernel(_dma_transpose_kernel[1, 2], *inputs, LARGE_TILE_SZ=1024)


@nki.jit
def _dma_transpose_kernel(query, key, value, kv_cache, block_tables, mask, softmax_scale=None,
                          mixed_precision=True, LARGE_TILE_SZ=2048):
    from nki_kernels.toolchain import nl
    from nki_kernels.dense.flash_paged_attention import flash_paged_attention_body, output_shape

    from nki_kernels.ops import legacy

    o = nl.ndarray(output_shape(query), dtype=query.dtype, buffer=nl.shared_hbm)
    return flash_paged_attention_body(legacy, query, key, value, kv_cache, block_tables, mask,
                                      softmax_scale, mixed_precision, LARGE_TILE_SZ, out=o,
                                      p_transpose="dma")


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "fp16"])
def test_fp16_inputs(batch_factory, check_reference, mixed):
    # fp16 end to end (mixed=False keeps fp16 matmul inputs/probabilities/accumulator; the
    # statistics stay fp32 because the masking sentinels do not fit fp16).
    batch = batch_factory(14, [12, 1, 1], [150, 600, 7], H=6, Hkv=3, d=40, block_size=8,
                          dtype=np.float16)
    with nki_sim.use_target("trn2"):
        check_reference(batch, mixed_precision=mixed, large_tile_size=1024)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_oldest_supported_sdk_and_traced_loop_rules(target, batch_factory, check_reference,
                                                    on_api):
    # Only APIs present in Neuron SDK 2.21 (the oldest legacy release the project supports), and
    # no Python decision on an affine/sequential loop variable (undefined under the legacy tracer).
    # The SDK floors are the legacy API's: the scheduled kernel runs on it on both targets here.
    on_api("legacy", target)
    batch = batch_factory(15, [130, 1, 2], [300, 2100, 0], H=4, Hkv=2, d=32, block_size=16,
                          dtype=ml_dtypes.bfloat16)
    with nki_sim.configure(sdk="2.21", traced_loops="error"), nki_sim.use_target(target):
        check_reference(batch, mixed_precision=True, large_tile_size=4096, kernels=("dense",))
    # The scheduled kernel skips padding rows with oob_mode (SDK 2.23): older SDKs get a
    # NotImplementedError naming the SDK, and at 2.23 the same traced-loop rules hold.
    with nki_sim.configure(sdk="2.22"), nki_sim.use_target(target):
        with pytest.raises(NotImplementedError, match="2.23"):
            check_reference(batch, mixed_precision=True, large_tile_size=4096,
                            kernels=("scheduled",))
    with nki_sim.configure(sdk="2.23", traced_loops="error"), nki_sim.use_target(target):
        check_reference(batch, mixed_precision=True, large_tile_size=4096, kernels=("scheduled",))


@pytest.mark.slow
def test_long_prefill_in_two_query_groups(batch_factory, check_reference, monkeypatch):
    # 20 Q tiles x 8 query heads per KV head, d = 128: the SBUF plan splits the queries into
    # groups (KV re-read per group); two active windows of 2048 keys for the last Q tiles.
    batch = batch_factory(16, [2400, 1, 100], [3000, 5000, 0], H=8, Hkv=1, d=128, block_size=64,
                          dtype=ml_dtypes.bfloat16)
    with nki_sim.use_target("trn2"):
        check_reference(batch, mixed_precision=True, large_tile_size=2048, kernels=("scheduled",))
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:     # one core: its whole work
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
        check_reference(batch, mixed_precision=True, large_tile_size=2048, kernels=("dense",))
    s = trace.summary()
    assert not s["sbuf_over_capacity"]
    # dense kernel: 126 context blocks -> 4 tiles of 32 blocks (L = 128: one gather each for K and V);
    # two query groups, each loading every tile once
    assert s["dma_indirect_instructions"] == 2 * 4 * 2
