#!/usr/bin/env python
"""Host time per step: plan once + L runs vs L replans (MEASURED CPU wall time, host side only).

A model's step runs one batch through L layers. ``host.plan_paged_attention`` builds what
depends on the batch alone (schedule, metadata, per-row initial values) once;
``host.run_paged_attention`` builds only each layer's tensors (packed Q^T, overlay) and unpacks
the output. This script times both ways of running a step with the kernel launch replaced by a
stub that returns zeros of the kernel's output shape, so only host work is measured (no
simulation, no device):

    plan once + L runs    plan_paged_attention(...) then L x run_paged_attention(plan, ...)
    L replans             L x paged_attention(...)  (what every layer did before the split)

Default workload: L = 32 layers, 256 decode sequences x 4096 context tokens, H = 32, Hkv = 8,
d = 128, block size 32, bf16, mixed precision, the scheduled kernel. The cache holds 1024
blocks that the block tables reuse (host work does not depend on distinct ids; a 32K-block
cache would need 4 GiB).

    python scripts/bench_plan_run.py            # ~1 min
    python scripts/bench_plan_run.py --quick --json out.json
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nki_pa_cli.script_args import add_common_args, parse_args, write_json  # noqa: E402

H, HKV, D, B, LT = 32, 8, 128, 32, 2048


def make_step(num_seqs: int, context: int, seed: int = 0) -> dict:
    """One decode step's inputs (bf16): query (S, H, d), key / value (S, Hkv, d), a
    (2, 1024, Hkv, B, d) cache and (S, context / B) block tables of random ids."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    N = 1024
    bf16 = ml_dtypes.bfloat16
    nblk = -(-context // B)
    return dict(
        query=rng.uniform(-1, 1, (num_seqs, H, D)).astype(bf16),
        key=rng.uniform(-1, 1, (num_seqs, HKV, D)).astype(bf16),
        value=rng.uniform(-1, 1, (num_seqs, HKV, D)).astype(bf16),
        kv_cache=rng.uniform(-1, 1, (2, N, HKV, B, D)).astype(bf16),
        block_tables=rng.integers(0, N, (num_seqs, nblk)).astype(np.int32),
        query_lens=np.ones(num_seqs, np.int64),
        context_lens=np.full(num_seqs, context, np.int64))


@contextlib.contextmanager
def stub_launches():
    """Replace the kernel launch of ``host.attention`` by zeros of the output shape."""
    import host.attention as ha

    real = ha.launch_kernel

    def stub(kernel, args, kwargs, **_):      # grid_heads, backend, api, lnc
        if len(args) == 6:                      # dense: (1, H, Qpad, d)
            _, hq, d, qpad = args[0].shape
            return np.zeros((1, hq, qpad, d), args[0].dtype)
        return np.zeros((args[1].shape[0], D), args[0].dtype)   # scheduled: (rows of q_init, d)

    ha.launch_kernel = stub
    try:
        yield
    finally:
        ha.launch_kernel = real


def time_step(step: dict, layers: int, repeats: int) -> dict:
    """Seconds per step of both ways: the fastest of ``repeats`` runs after one warm-up of each
    (the minimum: other load on the machine only ever adds time)."""
    import host

    geo = dict(num_heads=H, num_kv_heads=HKV, head_size=D, block_size=B,
               num_blocks=step["kv_cache"].shape[1], dtype=step["query"].dtype,
               large_tile_size=LT, backend="sim")
    tensors = (step["query"], step["key"], step["value"], step["kv_cache"])
    lens = (step["block_tables"], step["query_lens"], step["context_lens"])

    def plan_once():
        t0 = time.perf_counter()
        plan = host.plan_paged_attention(*lens, **geo)
        t_plan = time.perf_counter() - t0
        for _ in range(layers):
            host.run_paged_attention(plan, *tensors)
        return time.perf_counter() - t0, t_plan

    def replan():
        t0 = time.perf_counter()
        for _ in range(layers):
            host.paged_attention(*tensors, step["block_tables"], step["query_lens"],
                                 step["context_lens"], large_tile_size=LT, backend="sim")
        return time.perf_counter() - t0

    with stub_launches():
        plan_once(), replan()
        once = [plan_once() for _ in range(repeats)]
        again = [replan() for _ in range(repeats)]
    t_once, t_plan = min(once)
    t_again = min(again)
    return dict(plan_once_s=t_once, plan_s=t_plan, run_s=(t_once - t_plan) / layers,
                replan_s=t_again, ratio=t_once / t_again)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, quick_help="4 layers, 32 sequences x 1K context (seconds)")
    ap.add_argument("--layers", type=int, default=None, help="layers per step (default 32)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (default 3; 1 quick)")
    args = parse_args(ap, argv)
    layers = args.layers or (4 if args.quick else 32)
    repeats = args.repeats or (1 if args.quick else 3)
    if layers < 1 or repeats < 1:
        ap.error("--layers and --repeats must be >= 1")
    seqs, ctx = (32, 1024) if args.quick else (256, 4096)
    r = time_step(make_step(seqs, ctx), layers, repeats)
    row = dict(layers=layers, sequences=seqs, context=ctx, **r)
    print(f"host time per step, {layers} layers, {seqs} decode sequences x {ctx} context "
          f"(H={H}, Hkv={HKV}, d={D}, B={B}, bf16, scheduled kernel; MEASURED CPU wall time, "
          "kernel launch stubbed):")
    print(f"  plan once + {layers} runs : {r['plan_once_s'] * 1e3:9.1f} ms  (plan "
          f"{r['plan_s'] * 1e3:.1f} ms, {r['run_s'] * 1e3:.2f} ms per run)")
    print(f"  {layers} replans          : {r['replan_s'] * 1e3:9.1f} ms")
    print(f"  ratio                  : {r['ratio']:.3f}  (acceptance: <= 0.25)")
    write_json(args, __file__, [row])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
