"""Attention variants in the scheduled kernel on nki_sim vs the float64 reference.

``host.paged_attention(..., kernel="scheduled", sliding_window=, logits_soft_cap=,
alibi_slopes=, sinks=, k_scale=, v_scale=)`` against ``host.paged_attention_ref`` with the same
options (docs/attention-variants.md), with the tolerance of tests/conftest.py: each option
alone and combined, trn1 and trn2, prefill chunks + decodes + speculative decodes in one batch,
fp32 / bf16 inputs, mixed precision on and off, block sizes 1 .. 128, fp8 caches
(float8_e4m3fn / float8_e5m2 with per-head scales). Invalid option values, the dense kernel
and garbage outside a window live in test_scheduled_variants_checks.py.

FP8 caches are built here from the definition: the cache holds ``fp8(x / scale)`` of values x
in U[-1, 1] (|x / scale| <= 240, so e4m3fn needs no saturation), and the reference dequantizes
those fp8 values; the kernel must reproduce attention over exactly these cached values.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import nki_sim

pytestmark = pytest.mark.simulation

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
TARGETS = ("trn1", "trn2")

H, HKV, D = 8, 2, 32          # G = 4 query heads per KV head
# One prefill chunk (37 tokens x G = 148 query rows: two 128-row Q blocks), two decodes, one
# speculative decode (4 tokens) and a prefill from scratch (context 0); contexts span 1-3 KV
# tiles of 512 keys (large_tile_size=512).
MIXED = dict(query_lens=[37, 1, 4, 1, 70], context_lens=[300, 1100, 650, 9, 0])
LT = 512


def bloom_like_slopes(num_heads):
    """ALiBi slopes 2^(-8 i / H), i = 1..H (H a power of two), written out independently."""
    return np.array([2.0 ** (-8.0 * i / num_heads) for i in range(1, num_heads + 1)], np.float32)


def options(name, seed=1):
    """Variant keyword arguments by name ("window", "softcap", "alibi", "sinks", ...)."""
    rng = np.random.default_rng(seed)
    table = {
        "window": dict(sliding_window=200),
        "window1": dict(sliding_window=1),
        "window_tile": dict(sliding_window=LT),
        "window_huge": dict(sliding_window=1 << 20),
        "softcap": dict(logits_soft_cap=0.3),
        "softcap_mid": dict(logits_soft_cap=2.0),
        "softcap_loose": dict(logits_soft_cap=30.0),
        "alibi": dict(alibi_slopes=bloom_like_slopes(H)),
        "sinks": dict(sinks=rng.normal(0.0, 2.0, H).astype(np.float32)),
        "sinks_big": dict(sinks=np.full(H, 6.0, np.float32)),
        "sinks_off": dict(sinks=np.full(H, -1e30, np.float32)),
    }
    return dict(table[name])


@dataclasses.dataclass
class Fp8Batch:
    """A kernel-test Batch whose cache was replaced by fp8 values, and the scales to pass."""
    batch: object
    k_scale: np.ndarray
    v_scale: np.ndarray


def to_fp8(batch, fp8, *, per_tensor=False):
    """Replace ``batch.kv_cache`` (values in [-1, 1]) by ``fp8(x / scale)`` with per-KV-head
    scales (or one scale); returns (batch, k_scale, v_scale)."""
    Hkv = batch.kv_cache.shape[2]
    if per_tensor:
        k_scale, v_scale = np.float32(1 / 200), np.float32(1 / 120)
        ks = np.full(Hkv, k_scale, np.float32)
        vs = np.full(Hkv, v_scale, np.float32)
    else:
        ks = (1.0 / np.linspace(230, 60, Hkv)).astype(np.float32)
        vs = (1.0 / np.linspace(100, 220, Hkv)).astype(np.float32)
        k_scale, v_scale = ks, vs
    raw = np.asarray(batch.kv_cache, np.float32)
    scaled = np.stack([raw[0] / ks[None, :, None, None], raw[1] / vs[None, :, None, None]])
    assert np.abs(scaled).max() <= 240.0
    batch = dataclasses.replace(batch, kv_cache=scaled.astype(fp8))
    return batch, k_scale, v_scale


def make(batch_factory, *, query_lens, context_lens, block_size=16, dtype=np.float32, fp8=None,
         per_tensor=False, seed=0):
    b = batch_factory(seed, query_lens, context_lens, H=H, Hkv=HKV, d=D, block_size=block_size,
                      dtype=dtype)
    if fp8 is None:
        return b, {}
    b, ks, vs = to_fp8(b, fp8, per_tensor=per_tensor)
    return b, dict(k_scale=ks, v_scale=vs)


def run(check_reference, batch, *, target="trn2", mixed_precision=True, large_tile_size=LT,
        **opts):
    with nki_sim.use_target(target):
        return check_reference(batch, mixed_precision=mixed_precision,
                               large_tile_size=large_tile_size, kernels=("scheduled",), **opts)


# --------------------------------------------------------------------------- one option at a time

ALONE = ["window", "window1", "window_tile", "window_huge", "softcap", "softcap_mid",
         "softcap_loose", "alibi", "sinks", "sinks_big", "sinks_off"]
# options whose effect on these inputs is below twice the tolerance (no-ops or nearly)
WEAK = ("window_huge", "window_tile", "softcap_mid", "softcap_loose", "sinks_off")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ALONE)
def test_each_option_alone(batch_factory, check_reference, tol, name, target):
    batch, _ = make(batch_factory, **MIXED)
    out, ref = run(check_reference, batch, target=target, **options(name))
    if name not in WEAK:
        # the option changes the result well beyond the tolerance (the test can see it)
        atol, _ = tol("mixed", batch.query.dtype)
        assert np.abs(ref - run_plain_reference(batch)).max() > 2 * atol


def run_plain_reference(batch, **opts):
    from host.reference import paged_attention_ref
    return paged_attention_ref(*batch.args(), **opts)


@pytest.mark.parametrize("cap", [1.0, 5.0])
@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "fp32"])
def test_softcap_large_logits(batch_factory, check_reference, cap, mixed):
    """softmax_scale = 1 gives logits of several units, so the tanh saturates."""
    batch, _ = make(batch_factory, **MIXED)
    run(check_reference, batch, mixed_precision=mixed, softmax_scale=1.0, logits_soft_cap=cap,
        sliding_window=300)


def test_no_op_options_equal_plain_attention(batch_factory, check_reference):
    """W >= every sequence length and a -1e30 sink change nothing (reference and kernel)."""
    batch, _ = make(batch_factory, **MIXED)
    plain = run_plain_reference(batch)
    out, ref = run(check_reference, batch, sliding_window=1 << 20,
                   sinks=np.full(H, -1e30, np.float32))
    assert np.abs(ref - plain).max() < 1e-12
    out_plain, _ = run(check_reference, batch)
    np.testing.assert_allclose(out, out_plain, rtol=0, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fp8, per_tensor", [(E4M3FN, False), (E4M3FN, True), (E5M2, False)],
                         ids=["e4m3fn_per_head", "e4m3fn_per_tensor", "e5m2_per_head"])
def test_fp8_cache_alone(batch_factory, check_reference, fp8, per_tensor, target):
    batch, scales = make(batch_factory, **MIXED, dtype=BF16, fp8=fp8, per_tensor=per_tensor)
    run(check_reference, batch, target=target, **scales)


@pytest.mark.parametrize("dtype, mixed", [(np.float32, True), (np.float32, False), (BF16, False)],
                         ids=["f32_mixed", "f32_fp32", "bf16_bf16"])
def test_fp8_cache_input_dtypes_and_precision(batch_factory, check_reference, dtype, mixed):
    batch, scales = make(batch_factory, **MIXED, dtype=dtype, fp8=E4M3FN)
    run(check_reference, batch, mixed_precision=mixed, **scales)


def test_fp8_cache_new_tokens_are_not_quantized(batch_factory, check_reference):
    """The new tokens' key / value are used as given (docs/attention-variants.md §1): prefill
    from scratch (no cached context at all) over an fp8 cache equals plain attention over the
    unquantized new tokens, to the fp32 tolerance."""
    batch, scales = make(batch_factory, query_lens=[20, 3], context_lens=[0, 0], fp8=E4M3FN)
    out, ref = run(check_reference, batch, mixed_precision=False, **scales)
    plain = run_plain_reference(dataclasses.replace(
        batch, kv_cache=batch.kv_cache.astype(np.float32)))
    np.testing.assert_allclose(ref, plain, atol=1e-12)


# ------------------------------------------------------------------------------- combinations

COMBOS = {
    "window+sinks+fp8": dict(window=True, sinks=True, fp8=True),
    "softcap+window": dict(window=True, softcap=True),
    "alibi+sinks": dict(alibi=True, sinks=True),
    "all": dict(window=True, softcap=True, alibi=True, sinks=True, fp8=True),
}


def combo(batch_factory, name, *, block_size=16, dtype=np.float32, window=200, lens=MIXED,
          fp8=E4M3FN):
    flags = COMBOS[name]
    batch, opts = make(batch_factory, **lens, block_size=block_size, dtype=dtype,
                       fp8=fp8 if flags.get("fp8") else None)
    if flags.get("window"):
        opts["sliding_window"] = window
    if flags.get("softcap"):
        opts.update(options("softcap_mid"))
    if flags.get("alibi"):
        opts.update(options("alibi"))
    if flags.get("sinks"):
        opts.update(options("sinks"))
    return batch, opts


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype, mixed", [(np.float32, True), (np.float32, False), (BF16, True),
                                          (BF16, False)],
                         ids=["f32_mixed", "f32_fp32", "bf16_mixed", "bf16_bf16"])
@pytest.mark.parametrize("name", list(COMBOS))
def test_combinations(batch_factory, check_reference, name, dtype, mixed, target):
    batch, opts = combo(batch_factory, name, dtype=dtype)
    run(check_reference, batch, target=target, mixed_precision=mixed, **opts)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("block_size, tile", [(1, 512), (4, 1024), (32, 2048), (128, 512),
                                              (128, 2048)])
def test_all_options_block_sizes(batch_factory, check_reference, block_size, tile, target):
    lens = dict(query_lens=[37, 1, 4, 1], context_lens=[150, 600, 333, 7]) if block_size == 1 \
        else MIXED
    batch, opts = combo(batch_factory, "all", block_size=block_size, lens=lens, window=150)
    run(check_reference, batch, target=target, large_tile_size=tile, **opts)


@pytest.mark.parametrize("fp8", [E4M3FN, E5M2], ids=["e4m3fn", "e5m2"])
@pytest.mark.parametrize("name", ["window+sinks+fp8", "all"])
def test_fp8_combinations_both_formats(batch_factory, check_reference, name, fp8):
    batch, opts = combo(batch_factory, name, dtype=BF16, fp8=fp8)
    run(check_reference, batch, **opts)


# Windows at every alignment against the 512-key tiles and the 16-token blocks, in a batch whose
# prefill chunk spans several tiles (some tiles visible to early rows only).
@pytest.mark.parametrize("window", [2, 15, 16, 17, 100, 511, 512, 513, 1000])
def test_window_edges(batch_factory, check_reference, window):
    batch, _ = make(batch_factory, query_lens=[300, 1, 2], context_lens=[700, 1300, 515])
    run(check_reference, batch, sliding_window=window, sinks=options("sinks")["sinks"])


@pytest.mark.parametrize("lens", [
    dict(query_lens=[1] * 6, context_lens=[1, 31, 32, 513, 1024, 2047]),            # decodes
    dict(query_lens=[4, 4, 3], context_lens=[0, 900, 17]),                           # spec decode
    dict(query_lens=[130, 1], context_lens=[0, 1]),                                  # prefill
    dict(query_lens=[17, 1, 5, 1, 64, 1], context_lens=[1, 2, 700, 1500, 64, 0]),    # mixed
], ids=["decodes", "spec", "prefill", "mixed"])
def test_all_options_batch_shapes(batch_factory, check_reference, lens):
    batch, opts = combo(batch_factory, "all", lens=lens, window=300)
    run(check_reference, batch, **opts)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_all_options_large_mixed_batch(batch_factory, check_reference, target):
    rng = np.random.default_rng(7)
    q = np.concatenate([rng.integers(20, 200, 3), np.ones(12, np.int64), np.full(4, 5)])
    c = rng.integers(0, 3000, q.shape[0])
    batch, opts = combo(batch_factory, "all", lens=dict(query_lens=q, context_lens=c),
                        window=700)
    run(check_reference, batch, target=target, large_tile_size=1024, **opts)
