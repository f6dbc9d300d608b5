"""Input validation of the kernel and of the host wrappers: every check must fire (ValueError
naming the argument / NotImplementedError saying what to do), and valid inputs must pass."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from host.attention import flash_attn_varlen_nkifunc, paged_attention
from nki_kernels.toolchain import nki
from nki_kernels.dense.flash_paged_attention import _check_inputs, flash_paged_attention

pytestmark = pytest.mark.simulation

H, HKV, D, QPAD, N, B, LT = 4, 2, 8, 128, 6, 4, 512
NAB = LT // B   # one large tile


def _valid(**over):
    """Kernel-layout inputs that pass every check (tiny: one tile, one Q tile)."""
    rng = np.random.default_rng(0)
    a = dict(
        query=rng.standard_normal((1, H, D, QPAD)).astype(np.float32),
        key=rng.standard_normal((1, HKV, D, QPAD)).astype(np.float32),
        value=rng.standard_normal((1, HKV, QPAD, D)).astype(np.float32),
        kv_cache=rng.standard_normal((2, N, HKV, B, D)).astype(np.float32),
        block_tables=np.zeros(NAB, np.int32),
        mask=np.tri(QPAD, NAB * B + QPAD, NAB * B, dtype=bool),
    )
    a.update(over)
    return a


def _run(grid=(1, HKV), **kw):
    a = _valid(**{k: v for k, v in kw.items() if k in ("query", "key", "value", "kv_cache",
                                                       "block_tables", "mask")})
    opts = {k: v for k, v in kw.items() if k not in a}
    return nki.simulate_kernel(flash_paged_attention[grid], a["query"], a["key"], a["value"],
                               a["kv_cache"], a["block_tables"], a["mask"], **opts)


def test_valid_inputs_pass():
    out = _run(LARGE_TILE_SZ=LT)
    assert out.shape == (1, H, QPAD, D) and np.isfinite(out).all()
    # [2, Hkv]: program (c, h) runs half of head h's query tiles (ops.query_part)
    np.testing.assert_allclose(_run(grid=(2, HKV), LARGE_TILE_SZ=LT), out, rtol=1e-6, atol=1e-7)


BAD = [
    ("query.shape[2] (head size d)", dict(query=np.zeros((1, H, 129, QPAD), np.float32))),
    ("query.shape[3] (Qpad)", dict(query=np.zeros((1, H, D, 100), np.float32))),
    ("query.shape[1] (H)", dict(query=np.zeros((1, 3, D, QPAD), np.float32))),
    ("query.dtype", dict(query=np.zeros((1, H, D, QPAD), np.int32))),
    ("key.shape", dict(key=np.zeros((1, HKV, D, 256), np.float32))),
    ("value.shape", dict(value=np.zeros((1, HKV, D, QPAD), np.float32))),
    ("key.dtype", dict(key=np.zeros((1, HKV, D, QPAD), np.float16))),
    ("kv_cache.shape[3] (block_size)", dict(kv_cache=np.zeros((2, N, HKV, 3, D), np.float32))),
    ("kv_cache.shape", dict(kv_cache=np.zeros((3, N, HKV, B, D), np.float32))),
    ("block_tables.dtype", dict(block_tables=np.zeros(NAB, np.uint32))),
    ("block_tables.shape[0] (num_active_blocks)", dict(block_tables=np.zeros(NAB - 1, np.int32))),
    ("mask.shape", dict(mask=np.ones((QPAD, NAB * B), bool))),
    ("mask.dtype", dict(mask=np.ones((QPAD, NAB * B + QPAD), np.float32))),
    ("LARGE_TILE_SZ", dict(LARGE_TILE_SZ=1000)),
    ("LARGE_TILE_SZ", dict(LARGE_TILE_SZ=256)),
    ("LARGE_TILE_SZ", dict(LARGE_TILE_SZ=16384)),
    ("softmax_scale", dict(softmax_scale=float("nan"), LARGE_TILE_SZ=LT)),
    ("mixed_precision", dict(mixed_precision="yes", LARGE_TILE_SZ=LT)),
    ("launch grid", dict(grid=(1, HKV + 1), LARGE_TILE_SZ=LT)),
    ("launch grid", dict(grid=(3, HKV), LARGE_TILE_SZ=LT)),
    ("launch grid", dict(grid=(2, HKV + 1), LARGE_TILE_SZ=LT)),
]


@pytest.mark.parametrize("arg, bad", BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(BAD)])
def test_kernel_rejects(arg, bad):
    bad = dict(bad)
    bad.setdefault("LARGE_TILE_SZ", LT)
    with pytest.raises(ValueError, match=r"flash_paged_attention: " + __import__("re").escape(arg) + " must "):
        _run(**bad)


def test_kernel_rejects_cache_dtype_mismatch_as_unsupported():
    with pytest.raises(NotImplementedError, match="cast the cache"):
        _run(kv_cache=np.zeros((2, N, HKV, B, D), ml_dtypes.bfloat16), LARGE_TILE_SZ=LT)


def test_block_ids_must_be_exact_in_fp32():
    # num_blocks * Hkv * tiling_factor >= 2**24 cannot go through the fp32 PE transposes; checked
    # on shapes only (no 2 GiB cache needed): B=256, LT=512 -> M=2, T=64.
    t = lambda shape, dt=np.float32: SimpleNamespace(shape=shape, dtype=np.dtype(dt))  # noqa: E731
    args = (t((1, 1, 1, 128)), t((1, 1, 1, 128)), t((1, 1, 128, 1)), t((2, 1 << 18, 1, 256, 1)),
            t((2,), np.int32), t((128, 512 + 128), np.bool_))
    with pytest.raises(ValueError, match=r"num_blocks \* Hkv \* tiling_factor < 2\*\*24"):
        _check_inputs(*args, None, True, 512)
    ok = (*args[:3], t((2, (1 << 18) - 1, 1, 256, 1)), *args[4:])
    assert _check_inputs(*ok, None, True, 512).T == 64


# ---- host wrappers ------------------------------------------------------------------------------

def _host_args(**over):
    rng = np.random.default_rng(1)
    a = dict(query=rng.standard_normal((5, H, D)).astype(np.float32),
             key=rng.standard_normal((5, HKV, D)).astype(np.float32),
             value=rng.standard_normal((5, HKV, D)).astype(np.float32),
             kv_cache=rng.standard_normal((2, N, HKV, B, D)).astype(np.float32),
             block_tables=np.array([[0, 1, -1], [2, 3, 4]], np.int32),
             query_lens=np.array([3, 2]), context_lens=np.array([5, 9]))
    a.update(over)
    return a


HOST_BAD = [
    ("query.dtype", dict(query=np.zeros((5, H, D), np.float64))),
    ("key", dict(key=np.zeros((5, 3, D), np.float32))),
    ("kv_cache.dtype", dict(kv_cache=np.zeros((2, N, HKV, B, D), np.float16))),
    ("block_tables", dict(block_tables=np.array([[0, 1, -1], [2, 3, N]], np.int32))),
    ("query_lens", dict(query_lens=np.array([3, 3]))),
    ("large_tile_size", dict(large_tile_size=1000)),
    ("backend", dict(backend="gpu")),
    ("mixed_precision", dict(mixed_precision=1)),
    ("softmax_scale", dict(softmax_scale="0.5")),
    ("head size d", dict(query=np.zeros((5, H, 130), np.float32), key=np.zeros((5, HKV, 130), np.float32),
                         value=np.zeros((5, HKV, 130), np.float32),
                         kv_cache=np.zeros((2, N, HKV, B, 130), np.float32), kernel="dense")),
    ("head size d", dict(query=np.zeros((5, H, 513), np.float32), key=np.zeros((5, HKV, 513), np.float32),
                         value=np.zeros((5, HKV, 513), np.float32),
                         kv_cache=np.zeros((2, N, HKV, B, 513), np.float32))),
    ("kernel", dict(kernel="sparse")),
    ("sliding_window", dict(sliding_window=0)),
    ("logits_soft_cap", dict(logits_soft_cap=-1.0)),
]


@pytest.mark.parametrize("arg, bad", HOST_BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(HOST_BAD)])
def test_paged_attention_rejects(arg, bad):
    a = _host_args(**bad)
    with pytest.raises(ValueError, match=__import__("re").escape(arg) + " must "):
        paged_attention(**a)


def test_dense_kernel_rejects_variants_and_fp8_caches():
    import ml_dtypes

    with pytest.raises(NotImplementedError, match="kernel='scheduled'"):
        paged_attention(**_host_args(kernel="dense", sliding_window=4))
    fp8 = _host_args()["kv_cache"].astype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="kernel='scheduled'"):
        paged_attention(**_host_args(kv_cache=fp8, kernel="dense", k_scale=1.0, v_scale=1.0))


def test_paged_attention_neuron_backend_needs_the_toolchain():
    from nki_kernels import toolchain

    if not toolchain.SIMULATED:
        pytest.skip("real neuronxcc active")
    with pytest.raises(RuntimeError, match="backend='neuron' needs the real Neuron toolchain"):
        paged_attention(**_host_args(backend="neuron"))


def test_paged_attention_valid_and_inputs_unmodified():
    a = _host_args()
    before = {k: np.array(v, copy=True) for k, v in a.items()}
    out = paged_attention(**a, backend="sim")
    assert out.shape == (5, H, D) and out.dtype == np.float32
    for k, v in a.items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_varlen_wrapper_checks_head_arguments():
    a = _valid()
    with pytest.raises(ValueError, match="n_kv_head must equal kv_cache.shape"):
        flash_attn_varlen_nkifunc(*a.values(), n_kv_head=HKV + 1, LARGE_TILE_SZ=LT)
    with pytest.raises(ValueError, match="head_size must equal kv_cache.shape"):
        flash_attn_varlen_nkifunc(*a.values(), head_size=D + 1, LARGE_TILE_SZ=LT)
    with pytest.raises(ValueError, match="attn_mask must hold only 0 and 1"):
        flash_attn_varlen_nkifunc(*list(a.values())[:5], a["mask"].astype(np.int32) * 2,
                                  LARGE_TILE_SZ=LT)


def test_uint8_mask_equals_bool_mask():
    a = _valid()
    ref = _run(LARGE_TILE_SZ=LT)
    out = _run(mask=a["mask"].astype(np.uint8), LARGE_TILE_SZ=LT)
    np.testing.assert_array_equal(out, ref)


def test_paged_attention_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    a = _host_args()
    ref = paged_attention(**a, backend="sim")
    t = {k: torch.from_numpy(v) for k, v in a.items()}
    out = paged_attention(**t, backend="sim")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), ref)


def test_oversized_block_table_is_unsupported():
    # B=1, LT=512: 4 rows-of-128 per tile, 4 bytes each -> 16 bytes per tile per partition;
    # 4097 tiles (2M+ context tokens) exceed the 64 KiB block-table budget. Shapes only.
    t = lambda shape, dt=np.float32: SimpleNamespace(shape=shape, dtype=np.dtype(dt))  # noqa: E731
    nab = 4097 * 512
    args = (t((1, 1, 8, 128)), t((1, 1, 8, 128)), t((1, 1, 128, 8)), t((2, 16, 1, 1, 8)),
            t((nab,), np.int32), t((128, nab + 128), np.bool_))
    with pytest.raises(NotImplementedError, match="use a larger block_size"):
        _check_inputs(*args, None, True, 512)
    ok = (*args[:4], t((nab - 512,), np.int32), t((128, nab - 512 + 128), np.bool_))
    assert _check_inputs(*ok, None, True, 512).n_tiles == 4096
