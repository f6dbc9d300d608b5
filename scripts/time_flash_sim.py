#!/usr/bin/env python
"""Simulation wall time of host.paged_attention on nki_sim for a mid-size case.

16 sequences, H=32, Hkv=8, d=128, block_size 32, 8192 context tokens per sequence,
LARGE_TILE_SZ=2048, mixed precision, fp32 inputs, trn2. Workloads:
    decode  every sequence schedules 1 new token (Qpad = 128)
    mixed   4 sequences schedule 128-token prefill chunks, 12 decode 1 token (Qpad = 640)
Reports the wall time of the simulation (a MEASURED CPU time of the simulator, not a device
time), the max error against the float64 reference, and trace counts; the modeled device time
comes from nki_sim.cost (MODELED).

    python scripts/time_flash_sim.py [--workload decode|mixed|both] [--quick] [--json out.json]
    python scripts/time_flash_sim.py --compare-p-transpose [--ctx 2048] [--quick] [--json out.json]
    python scripts/time_flash_sim.py --compare-api [--workload both] [--quick] [--json out.json]

--quick: 4 sequences of 512 context tokens instead of 16 of 8192 (same heads; seconds).

--compare-p-transpose runs the kernel body with p_transpose="auto" (gen3: nisa.dma_transpose of
P, vLLM's choice) and "pe" (TensorE transposes through PSUM) on trn2 and prints MODELED per-engine
times for both (no wall-time claim).

--compare-api runs the dense kernel (``host.paged_attention(kernel="dense")``, GQA packing
"auto") on trn2 on the legacy and on the current NKI API on one core, and on the current API on
both cores of the logical core (LNC 2: the KV heads split), and prints MODELED per-engine times
(LNC 2: the slower core's; no wall-time claim); the outputs must agree to 1e-6.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nki_pa_cli.script_args import add_common_args, parse_args, write_json  # noqa: E402

S, H, HKV, D, BLOCK, CTX, TILE = 16, 32, 8, 128, 32, 8192, 2048


def make_inputs(workload: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    # mixed: a quarter of the sequences schedule 128-token prefill chunks, the rest 1 token
    qlens = np.ones(S, np.int64) if workload == "decode" else np.array([128] * (S // 4) + [1] * (S - S // 4))
    clens = np.full(S, CTX, np.int64)
    T = int(qlens.sum())
    nblk = CTX // BLOCK
    N = S * nblk + 2
    bt = rng.permutation(N)[:S * nblk].reshape(S, nblk).astype(np.int32)
    u = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    return (u(T, H, D), u(T, HKV, D), u(T, HKV, D), u(2, N, HKV, BLOCK, D), bt, qlens, clens)


def run(workload: str) -> dict:
    import nki_sim
    from nki_sim.cost import estimate
    from host.attention import paged_attention
    from host.reference import paged_attention_ref

    args = make_inputs(workload)
    with nki_sim.use_target("trn2"):
        t0 = time.perf_counter()
        out = paged_attention(*args, large_tile_size=TILE, mixed_precision=True, backend="sim")
        wall = time.perf_counter() - t0
        with nki_sim.tracing() as trace:
            paged_attention(*args, large_tile_size=TILE, mixed_precision=True, backend="sim")
    err = float(np.abs(out - paged_attention_ref(*args)).max())
    s = trace.summary()
    rep = estimate(trace, target="trn2")
    return dict(workload=workload, sim_wall_s=round(wall, 2), max_abs_err=err,
                instructions=s["instructions"], dma_instructions=s["dma_instructions"],
                dma_indirect_instructions=s["dma_indirect_instructions"],
                peak_sbuf_bytes_per_partition=s["peak_sbuf_bytes_per_partition"],
                modeled_us=round(rep.modeled_us, 1))


def compare_p_transpose(workload: str) -> list[dict]:
    """MODELED trn2 cost of the two P-transpose paths (same inputs, same results)."""
    import nki_sim
    from nki_sim.cost import estimate
    from host.dense.block_tables import active_block_table
    from host.dense.masks import build_attention_mask
    from host.dense.plan import make_plan
    from nki_kernels.toolchain import nki, nl
    from nki_kernels.dense.flash_paged_attention import flash_paged_attention_body, output_shape
    from nki_kernels.ops import legacy

    def kernel_for(mode):
        @nki.jit
        def k(query, key, value, kv_cache, block_tables, mask, LARGE_TILE_SZ=2048):
            o = nl.ndarray(output_shape(query), dtype=query.dtype, buffer=nl.shared_hbm)
            return flash_paged_attention_body(legacy, query, key, value, kv_cache, block_tables,
                                              mask, LARGE_TILE_SZ=LARGE_TILE_SZ, out=o,
                                              p_transpose=mode)
        return k

    q, k, v, cache, bt2d, qlens, clens = make_inputs(workload)
    plan = make_plan(qlens, clens, block_size=BLOCK, large_tile_size=TILE)
    T, Qpad = q.shape[0], plan.padded_queries
    qi = np.zeros((1, H, D, Qpad), np.float32)
    qi[0, :, :, :T] = q.transpose(1, 2, 0)
    ki = np.zeros((1, HKV, D, Qpad), np.float32)
    ki[0, :, :, :T] = k.transpose(1, 2, 0)
    vi = np.zeros((1, HKV, Qpad, D), np.float32)
    vi[0, :, :T] = v.transpose(1, 0, 2)
    args = (qi, ki, vi, cache, active_block_table(plan, bt2d), build_attention_mask(plan))
    rows, outs = [], []
    for mode in ("auto", "pe"):
        with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
            outs.append(nki.simulate_kernel(kernel_for(mode)[1, HKV], *args, LARGE_TILE_SZ=TILE))
        rep = estimate(trace, target="trn2")
        rows.append(dict(workload=workload, p_transpose=mode, modeled_us=round(rep.modeled_us, 1),
                         **{f"{e}_us": round(t, 1) for e, t in rep.per_engine_us.items()}))
    assert np.array_equal(outs[0], outs[1]), "the two P-transpose paths must agree bit for bit"
    return rows


def compare_api(workload: str) -> list[dict]:
    """MODELED trn2 cost of the dense kernel on the legacy and the current API on one core and
    on the current API on two (same inputs; LNC 2: the slower core's figures)."""
    import nki_sim
    from nki_sim.cost import estimate_cores
    from host.attention import paged_attention

    args = make_inputs(workload)
    rows, outs = [], []
    for api, lnc in (("legacy", 1), ("nki", 1), ("nki", 2)):
        with nki_sim.use_target("trn2"), nki_sim.tracing() as trace:
            outs.append(paged_attention(*args, kernel="dense", large_tile_size=TILE,
                                        mixed_precision=True, backend="sim", api=api, lnc=lnc))
        launch = estimate_cores(trace, target="trn2")
        rep = launch.per_core[launch.slowest_core]
        rows.append(dict(workload=workload, api=api, lnc=lnc, modeled_us=round(launch.launch_us, 1),
                         dma_instructions=rep.dma_instructions,
                         **{f"{e}_us": round(t, 1) for e, t in rep.per_engine_us.items()}))
    err = max(float(np.abs(outs[0].astype(np.float64) - o).max()) for o in outs[1:])
    assert err <= 1e-6, f"the APIs and core counts must agree to 1e-6; max |difference| {err:.2e}"
    return rows


QUICK_S, QUICK_CTX = 4, 512


def main(argv=None) -> int:
    global S, CTX
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("decode", "mixed", "both"), default="decode")
    ap.add_argument("--compare-p-transpose", action="store_true")
    ap.add_argument("--compare-api", action="store_true",
                    help="the dense kernel on the legacy and the current API (trn2, MODELED)")
    ap.add_argument("--ctx", type=int, default=None,
                    help=f"context tokens per sequence (default {CTX}; {QUICK_CTX} with --quick)")
    add_common_args(ap, quick_help=f"{QUICK_S} sequences, {QUICK_CTX} context tokens each")
    a = parse_args(ap, argv)
    CTX = (QUICK_CTX if a.quick else CTX) if a.ctx is None else a.ctx
    S = QUICK_S if a.quick else S
    if CTX < BLOCK or CTX % BLOCK:
        ap.error(f"--ctx must be a positive multiple of the block size {BLOCK}; got {CTX}")
    workloads = ("decode", "mixed") if a.workload == "both" else (a.workload,)
    if a.compare_p_transpose:
        rows = [r for w in workloads for r in compare_p_transpose(w)]
        print(f"MODELED trn2, S={S} H={H} Hkv={HKV} d={D} B={BLOCK} ctx={CTX}/seq LT={TILE}")
        for r in rows:
            print(r)
        write_json(a, __file__, rows, mode="compare-p-transpose", sequences=S, ctx=CTX, times="MODELED")
        return 0
    if a.compare_api:
        rows = [r for w in workloads for r in compare_api(w)]
        print(f"MODELED trn2, dense kernel, S={S} H={H} Hkv={HKV} d={D} B={BLOCK} ctx={CTX}/seq "
              f"LT={TILE}")
        for r in rows:
            print(r)
        write_json(a, __file__, rows, mode="compare-api", sequences=S, ctx=CTX, times="MODELED")
        return 0
    rows = [run(w) for w in workloads]
    print(f"S={S} H={H} Hkv={HKV} d={D} B={BLOCK} ctx={CTX}/seq LARGE_TILE_SZ={TILE} trn2 mixed-precision")
    print(f"{'workload':8} {'sim wall s':>10} {'max err':>9} {'instr':>8} {'DMA':>7} {'indirect':>8} "
          f"{'modeled us (MODELED)':>21}")
    for r in rows:
        print(f"{r['workload']:8} {r['sim_wall_s']:>10} {r['max_abs_err']:>9.2e} {r['instructions']:>8} "
              f"{r['dma_instructions']:>7} {r['dma_indirect_instructions']:>8} {r['modeled_us']:>21}")
    write_json(a, __file__, rows, mode="wall-time", sequences=S, ctx=CTX)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
