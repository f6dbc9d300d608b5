#!/usr/bin/env python
"""Time host preparation for one flat batch: plan, active block table, transformed block tables
(all KV heads) and the kernel mask; report mask memory and what a compact mask form would save.

Default batch: 256 sequences with ~4K-token contexts (uniform in [3584, 4608], seeded),
block 32, LARGE_TILE_SZ 2048, Hkv 8; query lens = 240 decode sequences (q=1) + 16 chunked-prefill
sequences (q=64), shuffled. Also runs an all-decode batch (256 x q=1) for comparison.

Measured wall-clock on this machine, single process (NumPy, one thread for these ops); median of
--repeats runs. "fresh" allocates the dense mask with np.zeros and writes each sequence's band;
NumPy maps large arrays with transparent huge pages, so the band writes fault in (and the kernel
zero-fills) most of the buffer: this is the real cost of a new dense mask. "out= reuse" writes
into a preallocated buffer (one memset + the bands), what a runner reusing a shape bucket pays.

    python scripts/bench_host_prep.py [--repeats 15] [--quick] [--json out.json]

--quick: 28 decode + 4 prefill sequences, 3 repeats (a smoke run; the figures are not those of
docs/host-api.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nki_pa_cli.script_args import add_common_args, parse_args, write_json  # noqa: E402
from host.dense.block_tables import active_block_table, transform_block_tables_all_heads  # noqa: E402
from host.dense.masks import (build_attention_mask, context_row_ranges, query_seq_ids)  # noqa: E402
from host.dense.plan import make_plan  # noqa: E402


def median_ms(fn, repeats: int) -> tuple[float, object]:
    out = fn()                                           # warm-up (also returns the value)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e3, out


def make_batch(n_decode: int, n_prefill: int, prefill_len: int, seed: int):
    rng = np.random.default_rng(seed)
    S = n_decode + n_prefill
    qlens = np.array([1] * n_decode + [prefill_len] * n_prefill, dtype=np.int64)
    rng.shuffle(qlens)
    clens = rng.integers(3584, 4609, size=S)
    return qlens, clens


def run_case(label: str, qlens, clens, *, block_size: int, tile: int, hkv: int, repeats: int,
             seed: int) -> dict:
    rng = np.random.default_rng(seed)
    S = len(qlens)
    nblk = -(-clens // block_size)
    max_blocks = int(nblk.max())
    num_blocks = int(nblk.sum()) + 16
    bt2d = np.full((S, max_blocks), -1, dtype=np.int32)
    perm = rng.permutation(num_blocks).astype(np.int32)
    cols = np.arange(max_blocks)[None, :] < nblk[:, None]
    bt2d[cols] = perm[: int(nblk.sum())]

    t_plan, plan = median_ms(lambda: make_plan(qlens, clens, block_size=block_size,
                                               large_tile_size=tile), repeats)
    t_active, active = median_ms(lambda: active_block_table(plan, bt2d, num_blocks=num_blocks), repeats)
    t_tables, tables = median_ms(lambda: transform_block_tables_all_heads(
        active, num_kv_heads=hkv, block_size=block_size, large_tile_size=tile), repeats)
    mask_repeats = max(3, repeats // 3)
    t_mask, mask = median_ms(lambda: build_attention_mask(plan), mask_repeats)
    t_mask_reuse, _ = median_ms(lambda: build_attention_mask(plan, out=mask), mask_repeats)
    del mask
    t_compact, _ = median_ms(lambda: (context_row_ranges(plan), query_seq_ids(plan)), repeats)

    Q, ctx = plan.padded_queries, plan.context_kv_len
    dense_bytes = Q * (ctx + Q)
    compact_bytes = Q * (8 + 8 + 8)                          # start, end, seq id per row (int64)
    true_entries = int((qlens * (clens + qlens)).sum())
    res = dict(
        label=label, num_seqs=S, num_queries=int(plan.num_queries), padded_queries=Q,
        context_kv_len=ctx, num_large_tiles=plan.num_large_tiles, block_size=block_size,
        large_tile_size=tile, num_kv_heads=hkv,
        ms=dict(plan=t_plan, active_table=t_active, transformed_tables_all_heads=t_tables,
                mask_build=t_mask, mask_build_reused_buffer=t_mask_reuse,
                compact_mask_build=t_compact),
        ms_total_without_mask=t_plan + t_active + t_tables,
        ms_total=t_plan + t_active + t_tables + t_mask,
        bytes=dict(dense_mask=dense_bytes, dense_true_entries=true_entries,
                   compact_mask=compact_bytes, transformed_tables=int(tables.nbytes),
                   active_table=int(active.nbytes)),
    )
    return res


def print_case(r: dict) -> None:
    ms, b = r["ms"], r["bytes"]
    print(f"\n== {r['label']}: S={r['num_seqs']} T={r['num_queries']} Qpad={r['padded_queries']} "
          f"ctx={r['context_kv_len']} tiles={r['num_large_tiles']} B={r['block_size']} "
          f"LT={r['large_tile_size']} Hkv={r['num_kv_heads']}")
    print(f"  make_plan                         {ms['plan']:9.3f} ms")
    print(f"  active_block_table                {ms['active_table']:9.3f} ms")
    print(f"  transform_block_tables_all_heads  {ms['transformed_tables_all_heads']:9.3f} ms"
          f"   ({b['transformed_tables'] / 1e6:.2f} MB int32)")
    print(f"  build_attention_mask (fresh)      {ms['mask_build']:9.3f} ms   (np.zeros + bands; page faults)")
    print(f"  build_attention_mask (out= reuse) {ms['mask_build_reused_buffer']:9.3f} ms   (memset + bands)")
    print(f"  total (plan + tables)             {r['ms_total_without_mask']:9.3f} ms")
    print(f"  total incl. fresh dense mask      {r['ms_total']:9.3f} ms")
    print(f"  dense mask: {b['dense_mask'] / 1e6:,.1f} MB bool, of which {b['dense_true_entries'] / 1e6:,.2f} M entries True "
          f"({100 * b['dense_true_entries'] / b['dense_mask']:.3f} %)")
    print(f"  compact form (row start/end + seq id, int64): {b['compact_mask'] / 1e3:,.1f} kB "
          f"(x{b['dense_mask'] / b['compact_mask']:,.0f} smaller), built in {ms['compact_mask_build']:.3f} ms")


def growth_table() -> list[dict]:
    rows = []
    print("\nDense mask size = Qpad * (ctx + Qpad) bytes  vs  compact = 24 * Qpad bytes")
    print(f"  {'Qpad':>6} {'ctx tokens':>11} {'dense':>12} {'compact':>10}")
    for Q in (128, 256, 1280, 4096):
        for ctx in (65_536, 262_144, 1_048_576):
            dense, compact = Q * (ctx + Q), 24 * Q
            rows.append(dict(padded_queries=Q, context_kv_len=ctx, dense_bytes=dense, compact_bytes=compact))
            print(f"  {Q:>6} {ctx:>11,} {dense / 1e6:>10,.1f}MB {compact / 1e3:>8,.1f}kB")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=None, help="timing repeats (default 15; 3 with --quick)")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--tile", type=int, default=2048)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--decode", type=int, default=None, help="decode sequences (default 240; 28 with --quick)")
    ap.add_argument("--prefill", type=int, default=None, help="prefill sequences (default 16; 4 with --quick)")
    ap.add_argument("--prefill-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    add_common_args(ap, quick_help="a small batch (28 decode + 4 prefill), 3 repeats")
    a = parse_args(ap, argv)
    small = {"repeats": 3, "decode": 28, "prefill": 4} if a.quick else {"repeats": 15, "decode": 240, "prefill": 16}
    for k, v in small.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    for k in ("repeats", "block_size", "tile", "kv_heads", "prefill_len"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1; got {getattr(a, k)}")
    if a.decode < 0 or a.prefill < 0 or a.decode + a.prefill < 1:
        ap.error(f"--decode and --prefill must be >= 0 with at least one sequence; got {a.decode}, {a.prefill}")

    kw = dict(block_size=a.block_size, tile=a.tile, hkv=a.kv_heads, repeats=a.repeats, seed=a.seed)
    results = []
    q, c = make_batch(a.decode, a.prefill, a.prefill_len, a.seed)
    results.append(run_case(f"mixed: {a.decode} decode (q=1) + {a.prefill} prefill (q={a.prefill_len})",
                            q, c, **kw))
    q, c = make_batch(a.decode + a.prefill, 0, 1, a.seed)
    results.append(run_case(f"all decode: {a.decode + a.prefill} x q=1", q, c, **kw))
    print("host preparation timings: measured wall-clock, median of repeats, one process")
    for r in results:
        print_case(r)
    growth = growth_table()
    write_json(a, __file__, results, mask_growth=growth)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
