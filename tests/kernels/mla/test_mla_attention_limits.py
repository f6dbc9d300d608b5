"""MLA kernel limits: the SBUF budget (nki_kernels/mla/mla_sbuf.py) against the simulator's measured
peak, and the kernel's own argument checks when it is called directly (on both NKI APIs)."""

from __future__ import annotations

import numpy as np
import pytest

import nki_sim
from host import check_mla_inputs, mla_paged_attention
from host.mla.mla_attention import build_mla_overlay, mla_kernel_inputs, mla_schedule
from nki_kernels.mla.mla_sbuf import SBUF_USABLE, decode_chunk_cap, mla_group_blocks, mla_sbuf_bytes

from test_mla_attention import BF16, make_mla_batch

pytestmark = pytest.mark.simulation


def _budget(*, rows, blocks, entry_size, itemsize, kernel_itemsize, large_tile_size):
    bp = large_tile_size // 128
    decode = rows <= 64 and blocks == 1          # decode layout: Q^T preloaded per chunk
    cap = decode_chunk_cap(key_width=576, rows=rows, kernel_itemsize=kernel_itemsize)
    return mla_sbuf_bytes(loads=1, tiled_block_size=bp, entry_size=entry_size, key_width=576,
                          value_width=512, rows=rows, blocks=blocks, cache_itemsize=itemsize,
                          kernel_itemsize=kernel_itemsize, query_itemsize=itemsize,
                          preload_cols=cap * rows if decode else 0)


@pytest.mark.parametrize("dtype, mixed, lt, H, qlen, blocks", [
    (np.float32, False, 2048, 128, 8, 3),  # fp32 compute: the budget allows 3 of the 8 blocks
    (BF16, True, 2048, 128, 8, 8),
    (BF16, True, 4096, 128, 5, 4),         # 4096-key tiles: 4 of the 5 blocks per group
    (np.float32, False, 2048, 16, 4, 1),   # 64 decode rows: keys on partitions
], ids=["fp32_lt2048", "bf16_lt2048", "bf16_lt4096", "fp32_decode64"])
def test_sbuf_budget_bounds_the_simulated_peak(dtype, mixed, lt, H, qlen, blocks):
    """Chunks of qlen tokens x H heads (qlen*H/128 row blocks, or one decode block of <= 64
    rows) on trn1, the smaller SBUF: the host picks the group size from the budget, the
    simulated peak stays under both the budget and trn1's SBUF."""
    q, cache, bt, ql, cl = make_mla_batch(11, [qlen], [qlen + 30], H=H, block_size=16,
                                          entry_size=640, dtype=dtype)
    with nki_sim.use_target("trn1"), nki_sim.tracing() as trace:
        mla_paged_attention(q, cache, bt, ql, cl, mixed_precision=mixed, large_tile_size=lt,
                            backend="sim")
    s = trace.summary()
    itemsize = np.dtype(dtype).itemsize
    rows = min(128, qlen * H)
    need = _budget(rows=rows, blocks=blocks, entry_size=640, itemsize=itemsize,
                   kernel_itemsize=2 if mixed else itemsize, large_tile_size=lt)
    assert s["peak_sbuf_bytes_per_partition"] <= need <= SBUF_USABLE["gen2"]
    assert not s["sbuf_over_capacity"] and not s["psum_over_capacity"]
    over = _budget(rows=128, blocks=blocks + 1, entry_size=640, itemsize=itemsize,
                   kernel_itemsize=2 if mixed else itemsize, large_tile_size=lt)
    if blocks < min(8, qlen * H // 128):          # the budget, not the batch, limited the group
        assert over > SBUF_USABLE["gen2"]


@pytest.mark.parametrize("api", ["legacy", "nki"])
def test_sbuf_budget_bounds_the_simulated_peak_on_trn2(api):
    """The same bound on trn2 on both APIs (one source, the same tiles): 8 row blocks of bf16."""
    q, cache, bt, ql, cl = make_mla_batch(11, [8], [38], H=128, block_size=16, entry_size=640,
                                          dtype=BF16)
    with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
        mla_paged_attention(q, cache, bt, ql, cl, large_tile_size=2048, backend="sim", api=api)
    s = trace.summary()
    need = _budget(rows=128, blocks=8, entry_size=640, itemsize=2, kernel_itemsize=2,
                   large_tile_size=2048)
    assert 0 < s["peak_sbuf_bytes_per_partition"] <= need <= SBUF_USABLE["gen3"]
    assert not s["sbuf_over_capacity"] and not s["psum_over_capacity"]


def test_decode_chunks_are_cut_to_the_q_preload_budget(tol):
    """64-row decode blocks in fp32: a metadata chunk may hold 16 items, but only 8 items' Q^T
    fit the preload budget, so the kernel cuts the chunk; results and SBUF stay right."""
    from test_mla_attention import check

    assert decode_chunk_cap(key_width=576, rows=64, kernel_itemsize=4) == 8
    batch = make_mla_batch(13, [4] * 4, [2100] * 4, H=16, block_size=16, entry_size=576,
                           dtype=np.float32)
    with nki_sim.tracing() as trace:
        check(batch, tol, mixed_precision=False, large_tile_size=512)
    preloads = [e for e in trace.events if e.engine == "dma" and e.dma_kind != "indirect"
                and tuple(e.out_shape)[1:] == (8 * 64,)]
    assert preloads and not trace.summary()["sbuf_over_capacity"]


def test_group_blocks_is_zero_when_one_block_does_not_fit():
    shape = dict(loads=1, tiled_block_size=32, entry_size=576, key_width=576, value_width=512,
                 rows=128, cache_itemsize=4, kernel_itemsize=4, query_itemsize=4)
    assert mla_group_blocks(nc_gen="gen2", max_blocks=8, **shape) == 0
    assert mla_group_blocks(nc_gen="gen2", max_blocks=8, **dict(shape, tiled_block_size=4)) == 8


def _direct_inputs(max_group_blocks, dtype=np.float32):
    q, cache, bt, ql, cl = make_mla_batch(12, [8], [40], H=128, block_size=16, entry_size=576,
                                          dtype=dtype)
    plan = check_mla_inputs(q, cache, bt, ql, cl)
    sched = mla_schedule(plan, bt, 2048, max_group_blocks, partial_tile_size=None)  # LTp = LT
    (cls,) = sched.classes
    args, inputs = mla_kernel_inputs(cls, q, cache, build_mla_overlay(sched, cache, bt, 576))
    assert inputs == {}              # a query-rows class: no decode-layout inputs
    return args


def simulate(api, args, inputs=None, **kw):
    """The MLA kernel of ``api`` called directly on the simulator with ``MLAOptions(**kw)``
    (writable argument copies: the current API updates array arguments in place)."""
    from nki_kernels.toolchain import resolve_api
    from nki_kernels.mla.mla_attention import MLAOptions, mla_paged_attention as kernel

    args = tuple(np.array(a) if isinstance(a, np.ndarray) else a for a in args)
    kwargs = {k: np.array(v) for k, v in (inputs or {}).items()}
    return resolve_api(api).launch(kernel, args, dict(kwargs, options=MLAOptions(**kw)),
                                   num_kv_heads=1, device=False)


@pytest.mark.parametrize("target, api", [("trn1", "legacy"), ("trn2", "nki")])
def test_kernel_rejects_more_blocks_than_fit_its_sbuf(target, api):
    args = _direct_inputs(8)
    usable = SBUF_USABLE["gen2" if target == "trn1" else "gen3"]
    with nki_sim.use_target(target):
        if api == "nki":       # trn2 fits more: the first count over its budget
            args = next(_direct_inputs(b) for b in range(4, 9)
                        if _budget(rows=128, blocks=b, entry_size=576, itemsize=4,
                                   kernel_itemsize=4, large_tile_size=2048) > usable)
        with pytest.raises(NotImplementedError, match=r"Q blocks of 128 rows .* SBUF"):
            simulate(api, args, mixed_precision=False)
        out = simulate(api, _direct_inputs(3), mixed_precision=False)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("kw, match", [
    (dict(kv_lora_rank=513, qk_rope_head_dim=63), r"kv_lora_rank, qk_rope_head_dim must be ints"),
    (dict(kv_lora_rank=500, qk_rope_head_dim=64), r"query_t.shape must be \(ngroups\*D, blocks\*rows\)"),
    (dict(softmax_scale=float("nan")), r"softmax_scale must be a finite real number"),
    (dict(mixed_precision=1), r"mixed_precision must be a bool"),
    (dict(LARGE_TILE_SZ=3000), r"LARGE_TILE_SZ must be a power of two"),
    (dict(PARTIAL_TILE_SZ=1000), r"PARTIAL_TILE_SZ must be None or a power of two"),
    (dict(PARTIAL_TILE_SZ=512), r"overlay.shape must be \(R_ov >= 1, b'_p\*E\)"),
])
@pytest.mark.parametrize("api", ["legacy", "nki"])
def test_kernel_argument_checks(kw, match, api):
    args = _direct_inputs(3)
    with pytest.raises(ValueError, match=match):
        simulate(api, args, **kw)
    with pytest.raises(ValueError, match=r"blocks must be an int in \[1, 8\]"):
        simulate(api, args[:-1] + (9,))


def _decode_inputs():
    """A decode-layout class (16 heads x 1 token): positional arguments and its keyword inputs."""
    q, cache, bt, ql, cl = make_mla_batch(13, [1, 1], [40, 300], H=16, block_size=16,
                                          entry_size=576)
    plan = check_mla_inputs(q, cache, bt, ql, cl)
    sched = mla_schedule(plan, bt, 2048, 8)
    (cls,) = sched.classes
    assert cls.decode_layout
    return ((q, cache, bt, ql, cl), sched.partial_tile_size,
            mla_kernel_inputs(cls, q, cache, build_mla_overlay(sched, cache, bt, 576)))


@pytest.mark.parametrize("api", ["legacy", "nki"])
def test_decode_layout_inputs_are_keywords_and_required(api):
    batch, ltp, (args, inputs) = _decode_inputs()
    assert sorted(inputs) == ["bounds_p", "q_full", "q_part"]
    with nki_sim.use_target("trn2"):
        out = simulate(api, args, inputs, PARTIAL_TILE_SZ=ltp)   # must pass: every input given
        host_out = mla_paged_attention(*batch, backend="sim", api=api)
        for name in inputs:                               # must fail: one left None
            with pytest.raises(ValueError, match=rf"{name} must be given for a decode-layout "
                                                 "class"):
                simulate(api, args, {k: v for k, v in inputs.items() if k != name},
                         PARTIAL_TILE_SZ=ltp)
    # the host scatters the kernel's rows (row r of the block = head r of the sequence's token)
    assert np.array_equal(np.asarray(out)[:16], np.asarray(host_out)[0])


def test_kernel_options_must_be_mla_options():
    from nki_kernels.toolchain import resolve_api
    from nki_kernels.mla.mla_attention import mla_paged_attention as kernel

    args = tuple(np.array(a) for a in _direct_inputs(3)[:-2]) + (128, 3)
    with nki_sim.use_target("trn1"), pytest.raises(ValueError,
                                                   match="options must be an MLAOptions"):
        resolve_api("legacy").launch(kernel, args, dict(options=dict(kv_lora_rank=512)),
                                     num_kv_heads=1, device=False)
