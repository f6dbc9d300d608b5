"""Shared harness of the scheduled kernel's trace tests: the documented tile geometry and one
kernel launch per class of a host schedule under the simulator's trace."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

import nki_sim
from host.scheduled.schedule import make_schedule
from host.scheduled.scheduled import build_overlay, kernel_inputs, pack_queries, row_init, unpack_output
from nki_kernels import toolchain
from nki_kernels.scheduled.scheduled_attention import SchedOptions, scheduled_paged_attention

P = 128
BF16 = ml_dtypes.bfloat16


def geometry(B, LT):
    """(Tf, b', nL) from docs/layouts.md §1."""
    M = LT // B
    Tf = P // M if M < P else 1
    return Tf, B // Tf, M * Tf // P


def prepare(batch, LT, LTp=None):
    T, H, d = batch.query.shape
    _, N, Hkv, B, _ = batch.kv_cache.shape
    s = make_schedule(batch.query_lens, batch.context_lens, batch.block_tables, num_heads=H,
                      num_kv_heads=Hkv, head_size=d, block_size=B, num_blocks=N,
                      large_tile_size=LT, partial_tile_size=LTp)
    return s, build_overlay(s, batch.kv_cache, batch.key, batch.value, batch.block_tables)


def launch(batch, s, overlay, classes, LT):
    """Run one kernel launch per class (with the classes' metadata as given); returns
    (output (T, H, d), trace)."""
    T, H, d = batch.query.shape
    Hkv = batch.kv_cache.shape[2]
    out = np.zeros((T, H, d), batch.query.dtype)
    with nki_sim.tracing() as trace:
        for cls in classes:
            args, inputs = kernel_inputs(cls, pack_queries(cls, batch.query, Hkv),
                                         row_init(cls, H, Hkv), batch.kv_cache, overlay)
            opts = SchedOptions(softmax_scale=1.0 / math.sqrt(d), mixed_precision=True,
                                LARGE_TILE_SZ=LT, PARTIAL_TILE_SZ=s.partial_tile_size)
            o = toolchain.nki.simulate_kernel(scheduled_paged_attention[1, Hkv], *args, options=opts,
                                         **inputs)
            unpack_output(cls, np.asarray(o), out)
    return out, trace

