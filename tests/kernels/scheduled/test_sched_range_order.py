"""The key-order transform of NeuronCore-v3 natural-order masked steps (docs/layouts.md §16.3,
``nki_kernels/scheduled/sched_range.py``) and its inverse, on both NKI APIs:

* tiled -> natural: ``natural_keys(k_t, b', n0)`` read as a matmul's moving operand (times an
  identity) gives, in column j, the K^T column of tile-local key ``n0 + j``, whose tiled column
  is ``l*128*b' + s*128 + p`` for key ``(l*128 + p)*b' + s``;
* natural -> tiled: ``transpose_blocks(interleave=b')`` of a natural-order P gives, in block
  u = l*b' + s, the transpose of P's keys ``l*128*b' + s + b'*i`` (i < 128): V's row order.

The expected values come from those formulas alone (NumPy), not from the kernel code."""

from __future__ import annotations

import numpy as np
import pytest

from host.launch import launch_kernel
from nki_kernels.ops import KernelFamily
from nki_kernels.scheduled.sched_range import natural_keys
from nki_kernels.tile_ops import identity_tile, transpose_blocks

P = 128
D, ROWS = 16, 8


def _index_column(ops, n):
    idx = ops.sbuf((n, 1), ops.int32)
    ops.iota(idx, step=0, partition_step=1)
    return idx


def _build_natural(ops):
    def natural_keys_kernel(k_t, bp_arg):
        """k_t (D, W) fp32 tiled K^T -> (D, W) fp32: every 512-key chunk in natural order."""
        bp = int(bp_arg.shape[1])
        W = k_t.shape[1]
        out = ops.ndarray((D, W), dtype=ops.float32, buffer=ops.SHARED_HBM)
        kt = ops.sbuf((D, W), ops.float32)
        ops.load(kt, k_t)
        eye = identity_tile(ops, D, ops.float32)
        res = ops.sbuf((D, W), ops.float32)
        for c in ops.static_range(W // 512):
            ps = ops.psum((D, 512), ops.float32)
            ops.matmul(ps, eye, natural_keys(ops, kt, bp, c * 512))
            ops.copy(res[:, ops.ds(c * 512, 512)], ps)
        ops.scatter(out, _index_column(ops, D), 0, res)
        return out

    return natural_keys_kernel


def _build_interleave(ops):
    def interleaved_transpose_kernel(probs, bp_arg):
        """probs (ROWS, W) fp32 in natural key order -> (128, W/128 * ROWS): P^T blocks in the
        tiled order."""
        bp = int(bp_arg.shape[1])
        W = probs.shape[1]
        out = ops.ndarray((P, (W // P) * ROWS), dtype=ops.float32, buffer=ops.SHARED_HBM)
        src = ops.sbuf((ROWS, W), ops.float32)
        ops.load(src, probs)
        dst = ops.sbuf((P, (W // P) * ROWS), ops.float32)
        transpose_blocks(ops, dst, 0, src, 0, P, W // P, interleave=bp)
        ops.scatter(out, _index_column(ops, P), 0, dst)
        return out

    return interleaved_transpose_kernel


NATURAL = KernelFamily(_build_natural, "natural_keys_kernel")
INTERLEAVE = KernelFamily(_build_interleave, "interleaved_transpose_kernel")


def _tiled_column(t, bp):
    """K^T column (tiled order) of tile-local key t."""
    row, s = divmod(t, bp)
    l, p = divmod(row, P)
    return l * P * bp + s * P + p


@pytest.mark.parametrize("api", ["legacy", "nki"])
@pytest.mark.parametrize("bp", [1, 2, 4, 8, 16])
def test_natural_keys_and_the_interleaved_transpose_invert_the_tiled_order(api, bp):
    import nki_sim

    W = max(512, P * bp)                 # whole loads (128 rows of b' keys) and chunks
    rng = np.random.default_rng(bp)
    k_t = rng.standard_normal((D, W)).astype(np.float32)
    want = np.stack([k_t[:, _tiled_column(t, bp)] for t in range(W)], axis=1)
    marker = np.zeros((1, bp), np.float32)       # b' as a static shape
    with nki_sim.use_target("trn2"):
        got = launch_kernel(NATURAL, (k_t, marker), {}, grid_heads=1, backend="sim", api=api)
    assert np.array_equal(got, want)

    probs = rng.standard_normal((ROWS, W)).astype(np.float32)   # natural order
    with nki_sim.use_target("trn2"):
        got_t = launch_kernel(INTERLEAVE, (probs, marker), {}, grid_heads=1, backend="sim",
                              api=api)
    for u in range(W // P):
        l, s = divmod(u, bp)
        cols = l * P * bp + s + bp * np.arange(P)
        assert np.array_equal(got_t[:, u * ROWS:(u + 1) * ROWS], probs[:, cols].T)
    # inverse: the blocks' rows put back at their keys rebuild P
    back = np.empty_like(probs)
    for u in range(W // P):
        l, s = divmod(u, bp)
        back[:, l * P * bp + s + bp * np.arange(P)] = got_t[:, u * ROWS:(u + 1) * ROWS].T
    assert np.array_equal(back, probs)


def test_the_order_checks_can_fail(monkeypatch):
    # must-fail: K^T read in its own (tiled) column order -- what the matmul saw before the
    # natural order -- is not the natural order the check demands (b' = 4)
    import nki_sim

    import nki_kernels.scheduled.sched_range as sr

    bp, W = 4, 512
    k_t = np.random.default_rng(0).standard_normal((D, W)).astype(np.float32)
    want = np.stack([k_t[:, _tiled_column(t, bp)] for t in range(W)], axis=1)
    monkeypatch.setattr(sr, "natural_keys", lambda ops, kt, b, n0: kt[:, ops.ds(n0, 512)])
    family = KernelFamily(_build_natural, "tiled_keys_kernel")
    monkeypatch.setitem(globals(), "natural_keys", sr.natural_keys)
    with nki_sim.use_target("trn2"):
        got = launch_kernel(family, (k_t, np.zeros((1, bp), np.float32)), {}, grid_heads=1,
                            backend="sim", api="nki")
    assert np.array_equal(got, k_t) and not np.array_equal(got, want)
