"""Workloads and useful-work accounting for scripts/bench_paged_attention.py.

A :class:`Workload` is one flat serving batch (per-sequence new-token counts and cached context
lengths). :func:`useful_work` counts what ANY correct kernel must do for it -- the bytes it has
to move and the FLOPs it has to compute -- from the definition of paged attention alone, and
:func:`useful_roofline_us` turns that into the time one NeuronCore needs at the cost model's
peak rates (``nki_sim.cost`` constants, unchanged). Wasted work (padding, masked-out scores,
re-read tiles) is never counted as work.

Useful bytes (per batch):
    every context K and V row once per KV head     2 * sum(c_i) * Hkv * d * itemsize
    the new tokens' q, k, v once                   T * (H + 2 * Hkv) * d * itemsize
    the output once                                T * H * d * itemsize
Useful FLOPs: 4 * d * H per visible (query, key) pair (QK^T and PV, 2 FLOPs per multiply-add),
where query j (0-based) of sequence i sees keys 0 .. c_i + j of the same sequence (causal):
    pairs_i = q_i * c_i + q_i * (q_i + 1) / 2.
Roofline bandwidth: what one NeuronCore can pull, min(HBM bandwidth per core, 16 DMA engines x
practical per-engine bandwidth) = 272 GB/s (trn1), 362.5 GB/s (trn2); compute: TensorE bf16 peak.
"""
from __future__ import annotations

import dataclasses

import numpy as np

H, HKV, D = 32, 8, 128          # Llama-3-8B-like attention geometry of every workload
ITEMSIZE = 2                     # bf16 queries and KV cache


@dataclasses.dataclass(frozen=True)
class Workload:
    """A flat batch: kind (decode / mixed / prefill), new tokens and cached tokens per sequence."""
    name: str
    kind: str
    query_lens: tuple
    context_lens: tuple

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def query_tokens(self) -> int:
        return int(sum(self.query_lens))

    @property
    def context_tokens(self) -> int:
        return int(sum(self.context_lens))


def _ints(rng, lo, hi, n):
    return tuple(int(x) for x in rng.integers(lo, hi + 1, n))


def decode_contexts(seed: int = 0, n: int = 32) -> tuple:
    """The base decode context distribution: n seeded uniform lengths in [2048, 8192]."""
    return _ints(np.random.default_rng(seed), 2048, 8192, n)


def decode_workload(num_seqs: int, base: tuple) -> Workload:
    """num_seqs decode sequences (1 new token each) whose contexts repeat ``base`` (num_seqs a
    multiple of len(base)): doubling the batch doubles the useful work exactly, so a modeled
    time ratio compares like with like."""
    if num_seqs % len(base):
        raise ValueError(f"num_seqs must be a multiple of len(base) = {len(base)}; got {num_seqs}")
    return Workload(f"decode_{num_seqs}", "decode", (1,) * num_seqs,
                    tuple(base) * (num_seqs // len(base)))


def make_workloads(quick: bool, seed: int = 0) -> list[Workload]:
    """The benchmark's batches (seeded). Full: decode 32/64/128/256 x 2K-8K context; mixed
    (2 chunks of 384 and 256 tokens + 30 decodes x ~2.5K; 4 chunks of 512 + 60 decodes x 2K-8K);
    prefill (2K new tokens on 2K context; 1K on 0). Quick: small versions of decode and mixed."""
    rng = np.random.default_rng(seed + 1)
    if quick:
        return [
            Workload("decode_8", "decode", (1,) * 8, _ints(rng, 2048, 4096, 8)),
            Workload("mixed_1x128+6", "mixed", (128,) + (1,) * 6, (512,) + _ints(rng, 1024, 2048, 6)),
        ]
    base = decode_contexts(seed)
    out = [decode_workload(n, base) for n in (32, 64, 128, 256)]
    out.append(Workload("mixed_2x+30", "mixed", (384, 256) + (1,) * 30,
                        (2048, 512) + _ints(rng, 2048, 3072, 30)))
    out.append(Workload("mixed_4x512+60", "mixed", (512,) * 4 + (1,) * 60,
                        _ints(rng, 0, 4096, 4) + _ints(rng, 2048, 8192, 60)))
    out.append(Workload("prefill_2k_on_2k", "prefill", (2048,), (2048,)))
    out.append(Workload("prefill_1k_on_0", "prefill", (1024,), (0,)))
    return out


def visible_pairs(query_lens, context_lens) -> int:
    """Number of (query, key) pairs of the same sequence with key position <= query position."""
    q = np.asarray(query_lens, np.int64)
    c = np.asarray(context_lens, np.int64)
    return int(np.sum(q * c + q * (q + 1) // 2))


def useful_work(w: Workload, *, heads: int = H, kv_heads: int = HKV, head_size: int = D,
                itemsize: int = ITEMSIZE) -> dict:
    """{"bytes": useful HBM bytes, "flops": useful FLOPs} of workload w (module docstring)."""
    T, C = w.query_tokens, w.context_tokens
    kv = 2 * C * kv_heads * head_size * itemsize
    new = T * (heads + 2 * kv_heads) * head_size * itemsize
    out = T * heads * head_size * itemsize
    flops = 4 * head_size * heads * visible_pairs(w.query_lens, w.context_lens)
    return {"bytes": kv + new + out, "flops": flops}


def roofline_bandwidth(hw) -> float:
    """Bytes/ns one NeuronCore can pull: min(HBM per core, all DMA engines at practical peak)."""
    return min(hw.hbm_bw_bytes_per_ns, hw.dma_engines * hw.dma_engine_bw_bytes_per_ns)


def useful_roofline_us(work: dict, target: str) -> dict:
    """{"us", "memory_us", "compute_us", "bound"} of the useful work on one NeuronCore."""
    from nki_sim.cost import get_constants
    hw = get_constants(target)
    mem = work["bytes"] / roofline_bandwidth(hw) / 1e3
    comp = work["flops"] / (hw.tensor_peak_tflops * 1e3) / 1e3
    return {"us": max(mem, comp), "memory_us": mem, "compute_us": comp,
            "bound": "memory" if mem >= comp else "compute"}


def make_batch(w: Workload, block_size: int, *, heads: int = H, kv_heads: int = HKV,
               head_size: int = D, seed: int = 0) -> dict:
    """Random bf16 tensors in the user layout (docs/layouts.md §2) for workload w.

    The cache is a pool of max(2 * longest sequence's blocks, 64) blocks; each sequence's block
    table is a random sample of distinct pool blocks, and sequences share the pool (as with
    prefix caching). A batch of 256 x 8K-token sequences would otherwise need a multi-GB cache;
    the kernels' work does not depend on which block ids a table holds."""
    import ml_dtypes
    rng = np.random.default_rng(seed)
    q_lens = np.asarray(w.query_lens, np.int64)
    c_lens = np.asarray(w.context_lens, np.int64)
    n_blk = -(-c_lens // block_size)
    N = max(2 * int(n_blk.max()), 64)
    bt = np.full((len(q_lens), max(1, int(n_blk.max()))), -1, np.int32)
    for i, n in enumerate(n_blk.tolist()):
        bt[i, :n] = rng.permutation(N)[:n]
    T = int(q_lens.sum())
    bf16 = np.dtype(ml_dtypes.bfloat16)

    def u(*shape):
        return rng.uniform(-1, 1, size=shape).astype(np.float32).astype(bf16)

    return dict(query=u(T, heads, head_size), key=u(T, kv_heads, head_size),
                value=u(T, kv_heads, head_size), kv_cache=u(2, N, kv_heads, block_size, head_size),
                block_tables=bt, query_lens=q_lens, context_lens=c_lens)
