"""Attention variants in host.paged_attention: rejected values, the dense kernel's refusal,
garbage outside a sliding window, and window pruning of the KV gathers (from the trace).

* Bad option values raise ``ValueError`` naming the argument before any kernel is launched
  (nothing traced).
* ``kernel="dense"`` raises ``NotImplementedError`` pointing to ``kernel="scheduled"`` for any
  variant option and for fp8 caches.
* Cache blocks entirely outside every query's window may hold NaN (in K and V): outputs stay
  finite and equal the reference (computed on the clean cache: those keys are invisible, so
  attention's definition does not read them).
* A 32K-context decode with W = 4K gathers about as many KV bytes as a 4K-context decode.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host.attention import paged_attention
from host.reference import paged_attention_ref

pytestmark = pytest.mark.simulation

E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
H, HKV, D, B = 8, 2, 32, 16
LENS = dict(query_lens=[5, 1, 3], context_lens=[40, 300, 17])


@pytest.fixture
def batch(batch_factory):
    return batch_factory(0, **LENS, H=H, Hkv=HKV, d=D, block_size=B)


def fp8_batch(batch):
    """The batch with its cache quantized to float8_e4m3fn (scale 1/200) and the scales."""
    import dataclasses
    cache = (np.asarray(batch.kv_cache, np.float32) * 200.0).astype(E4M3FN)
    return dataclasses.replace(batch, kv_cache=cache), dict(k_scale=1 / 200, v_scale=1 / 200)


def call(batch, kernel="scheduled", **opts):
    return paged_attention(*batch.args(), backend="sim", large_tile_size=512, kernel=kernel,
                           **opts)


# ------------------------------------------------------------------------------ bad values

NAN, INF = float("nan"), float("inf")
BAD = [
    ("sliding_window", dict(sliding_window=0)),
    ("sliding_window", dict(sliding_window=-4)),
    ("sliding_window", dict(sliding_window=2.5)),
    ("sliding_window", dict(sliding_window=True)),
    ("logits_soft_cap", dict(logits_soft_cap=0.0)),
    ("logits_soft_cap", dict(logits_soft_cap=-1.0)),
    ("logits_soft_cap", dict(logits_soft_cap=INF)),
    ("logits_soft_cap", dict(logits_soft_cap=NAN)),
    ("logits_soft_cap", dict(logits_soft_cap="3")),
    ("alibi_slopes", dict(alibi_slopes=np.ones(H + 1, np.float32))),
    ("alibi_slopes", dict(alibi_slopes=np.ones((1, H), np.float32))),
    ("alibi_slopes", dict(alibi_slopes=np.full(H, NAN, np.float32))),
    ("sinks", dict(sinks=np.zeros(HKV, np.float32))),
    ("sinks", dict(sinks=np.full(H, INF, np.float32))),
]
BAD_FP8 = [
    ("k_scale", dict(k_scale=NAN, v_scale=1.0)),
    ("k_scale", dict(k_scale=INF, v_scale=1.0)),
    ("v_scale", dict(k_scale=1.0, v_scale=0.0)),
    ("v_scale", dict(k_scale=1.0, v_scale=-0.5)),
    ("k_scale", dict(k_scale=np.ones(HKV + 1, np.float32), v_scale=1.0)),
    ("v_scale", dict(k_scale=1.0, v_scale=np.array([1.0, NAN], np.float32))),
    ("k_scale", dict()),                                    # fp8 cache without scales
    ("v_scale", dict(k_scale=1.0)),                         # ... or without v_scale
]


def _expect_value_error(batch, arg, opts):
    with nki_sim.tracing() as trace, pytest.raises(ValueError) as exc:
        call(batch, **opts)
    msg = str(exc.value)
    assert msg.startswith(arg) and " must " in msg and "got" in msg, msg
    assert not trace.events, "a kernel ran before the ValueError"


@pytest.mark.parametrize("arg, opts", BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(BAD)])
def test_bad_option_values_raise_value_error(batch, arg, opts):
    _expect_value_error(batch, arg, opts)


@pytest.mark.parametrize("arg, opts", BAD_FP8, ids=[f"{a}-{i}" for i, (a, _) in enumerate(BAD_FP8)])
def test_bad_fp8_scales_raise_value_error(batch, arg, opts):
    fb, _ = fp8_batch(batch)
    _expect_value_error(fb, arg, opts)


@pytest.mark.parametrize("arg", ["k_scale", "v_scale"])
def test_scales_without_fp8_cache_raise_value_error(batch, arg):
    _expect_value_error(batch, arg, {arg: 0.5})


# ----------------------------------------------------------------------------- dense kernel

DENSE_OPTS = {
    "sliding_window": dict(sliding_window=64),
    "logits_soft_cap": dict(logits_soft_cap=5.0),
    "alibi_slopes": dict(alibi_slopes=np.linspace(0.5, 0.01, H).astype(np.float32)),
    "sinks": dict(sinks=np.zeros(H, np.float32)),
}


@pytest.mark.parametrize("name", list(DENSE_OPTS))
def test_dense_kernel_refuses_variants(batch, name):
    with nki_sim.tracing() as trace, pytest.raises(NotImplementedError, match="scheduled"):
        call(batch, kernel="dense", **DENSE_OPTS[name])
    assert not trace.events


def test_dense_kernel_refuses_fp8_cache(batch):
    fb, scales = fp8_batch(batch)
    with nki_sim.tracing() as trace, pytest.raises(NotImplementedError, match="scheduled"):
        call(fb, kernel="dense", **scales)
    assert not trace.events


# ------------------------------------------------------------------ garbage outside the window

TILE = 512          # keys per KV tile of the scheduled kernel at B = 16, large_tile_size = 512


def _dead_blocks(batch, window, where):
    """Cache block ids whose every token is before the window of its sequence's FIRST query
    (position p = context, so outside every query's window): ``where="pruned"`` those in KV
    tiles that end before that window (no query of the sequence sees the tile), ``"edge"`` those
    in the tile that holds the window's first key (a tile the kernel gathers and masks)."""
    out = []
    for i, c in enumerate(batch.context_lens.tolist()):
        lo = c - window + 1                       # first visible key of the first query
        for j in range(max(0, lo) // B):          # blocks [0, lo // B) end before lo
            in_edge = (j * B) // TILE == lo // TILE
            if in_edge == (where == "edge"):
                out.append(int(batch.block_tables[i, j]))
    return sorted(out)


@pytest.mark.parametrize("where", ["pruned", "edge"])
@pytest.mark.parametrize("fp8", [False, True], ids=["f32_cache", "e4m3fn_cache"])
@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("window", [1, 40, 200, 500])
def test_nan_outside_every_window_never_reaches_the_output(batch_factory, tol, window, target,
                                                           fp8, where):
    """NaN in K and V of cache blocks before every window -- in tiles the schedule prunes, or
    in the tile the window edge cuts (gathered, then masked) -- and in unused cache blocks."""
    lens = dict(query_lens=[6, 1, 1, 3, 40], context_lens=[1500, 700, 2000, 260, 900])
    batch = batch_factory(3, **lens, H=H, Hkv=HKV, d=D, block_size=B, spare_blocks=3)
    opts = dict(sliding_window=window, sinks=np.linspace(-1, 1, H).astype(np.float32))
    if fp8:
        batch, scales = fp8_batch(batch)
        opts.update(scales)
    ref = paged_attention_ref(*batch.args(), **opts)           # clean cache
    dead = _dead_blocks(batch, window, where)
    used = set(batch.block_tables[batch.block_tables >= 0].tolist())
    spare = sorted(set(range(batch.kv_cache.shape[1])) - used)
    assert len(dead) >= 8 and spare
    poisoned = batch.kv_cache.copy()
    poisoned[:, dead + spare] = np.nan                         # fp8: e4m3fn NaN (0x7F)
    assert np.isnan(poisoned[:, dead].astype(np.float32)).all()
    batch.kv_cache = poisoned
    with nki_sim.use_target(target):
        out = call(batch, **opts)
    bad = ~np.isfinite(out)
    assert not bad.any(), (f"NaN reached {int(bad.sum())} outputs, tokens "
                           f"{sorted(set(np.nonzero(bad)[0].tolist()))[:8]}...")
    atol, _ = tol("mixed", batch.query.dtype)
    err = np.abs(out.astype(np.float64) - ref).max()
    assert err <= atol, err


# --------------------------------------------------------------------- window pruning (trace)

def _decode_trace(batch_factory, context, window):
    """Trace of one decode (1 new token) with ``context`` cached tokens; H=4, Hkv=1, d=32,
    block 32, tile 2048. Returns (summary, KV row bytes gathered, KV row size)."""
    Bk, d = 32, 32
    batch = batch_factory(5, [1], [context], H=4, Hkv=1, d=d, block_size=Bk, spare_blocks=1)
    opts = {} if window is None else dict(sliding_window=window)
    with nki_sim.tracing() as trace:
        out = paged_attention(*batch.args(), backend="sim", large_tile_size=2048, **opts)
    ref = paged_attention_ref(*batch.args(), **opts)
    assert np.abs(out - ref).max() <= 3e-2
    row = 16 * d * 4            # b' = 16 tokens of d fp32 channels per gathered row (B=32, LT=2048)
    kv = sum(e.bytes for e in trace.events
             if e.engine == "dma" and e.dma_kind == "indirect" and e.src_buffer == "hbm"
             and e.descriptor_bytes and set(e.descriptor_bytes) == {row})
    return trace.summary(), kv, d


def test_window_prunes_long_context_gathers(batch_factory):
    """32K context, W = 4K: KV bytes and all DMA bytes within 1.25x of a plain 4K-context
    decode, and under 1/6 of what reading the whole 32K context would take."""
    s_win, kv_win, d = _decode_trace(batch_factory, 32768, 4096)
    s_4k, kv_4k, _ = _decode_trace(batch_factory, 4096, None)
    full_32k = 2 * 32768 * d * 4                    # K and V of every cached token, one KV head
    assert kv_4k >= 2 * 4096 * d * 4                # the plain decode reads its whole context
    assert kv_win <= 1.25 * kv_4k, (kv_win, kv_4k)
    assert kv_win <= full_32k / 6, (kv_win, full_32k)
    assert s_win["dma_bytes"] <= 1.25 * s_4k["dma_bytes"], (s_win["dma_bytes"], s_4k["dma_bytes"])
