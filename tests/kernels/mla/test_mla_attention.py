"""MLA paged attention (host.mla_paged_attention, nki_kernels/mla/mla_attention.py) on nki_sim.

Every numerical test compares with the float64 reference ``host.mla_paged_attention_ref`` (written
from the definition) using the project tolerance table. Batches are built here from the
definition of the latent cache (docs/layouts.md §12), not with the host cache builders: entry
``[kv_c (R) | k_pe (P) | padding]``, token j of sequence i in block ``block_tables[i, j // B]``,
offset ``j % B``; the new tokens are the last ``query_lens[i]`` of ``context_lens[i]`` cached
tokens. Contexts stay small (a few tiles) so each kernel run takes well under a few seconds.
``api`` runs a test on a given NKI API (None: the simulator's default for the target); the
current API (trn2) and the legacy one (trn1, trn2) each run the sweeps where they add coverage.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_sim
from host import mla_paged_attention, mla_paged_attention_ref

pytestmark = pytest.mark.simulation

BF16 = np.dtype(ml_dtypes.bfloat16)
R, P = 512, 64


def make_mla_batch(seed, query_lens, context_lens, *, H, block_size, entry_size, dtype=BF16,
                   R=R, P=P, fill=0.0, spare_blocks=2):
    """``(q, kv_cache, block_tables, query_lens, context_lens)``: values U[-1, 1] in elements
    [0, R + P) of every used position, ``fill`` everywhere else (entry padding, block tails,
    spare blocks); blocks a random permutation, unused block-table entries -1."""
    rng = np.random.default_rng(seed)
    qlens = np.asarray(query_lens, np.int64)
    clens = np.asarray(context_lens, np.int64)
    B = block_size
    nblk = -(-clens // B)
    N = int(nblk.sum()) + spare_blocks
    perm = rng.permutation(N)
    bt = np.full((len(qlens), int(nblk.max()) + 1), -1, np.int64)
    cache = np.full((N, B, entry_size), fill, np.float32)
    off = 0
    for i, n in enumerate(nblk.tolist()):
        bt[i, :n] = perm[off:off + n]
        off += n
        pos = np.arange(clens[i])
        cache[bt[i, pos // B], pos % B, :R + P] = rng.uniform(-1, 1, (clens[i], R + P))
    q = rng.uniform(-1, 1, (int(qlens.sum()), H, R + P)).astype(np.float32)
    return q.astype(dtype), cache.astype(dtype), bt, qlens, clens


def check(batch, tol, *, mixed_precision=True, target="trn2", large_tile_size=2048, api=None,
          lnc=None, **kw):
    """Run the kernel on ``target`` (and ``api``: None = the target's; ``lnc``: None = the
    platform's) and compare with the reference; returns the output."""
    q, cache, bt, ql, cl = batch
    with nki_sim.use_target(target):
        out = mla_paged_attention(q, cache, bt, ql, cl, mixed_precision=mixed_precision,
                                  large_tile_size=large_tile_size, backend="sim", api=api,
                                  lnc=lnc, **kw)
    ref = mla_paged_attention_ref(q, cache, bt, ql, cl, **kw)
    assert out.shape == ref.shape and out.dtype == q.dtype
    atol, rtol = tol("mixed" if mixed_precision else "fp32", q.dtype)
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= atol + rtol * np.abs(ref)), f"max |err| {err.max():.3e} > atol {atol}"
    return out


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("entry_size", [576, 640], ids=["unaligned576", "aligned640"])
def test_matches_reference_entry_layouts_and_block_sizes(entry_size, block_size, target, tol):
    """trn1: the legacy API; trn2: the current API."""
    _matches_reference(entry_size, block_size, target, "legacy" if target == "trn1" else "nki",
                       tol)


@pytest.mark.parametrize("block_size", [16, 64])
def test_matches_reference_legacy_api_on_trn2(block_size, tol):
    _matches_reference(640, block_size, "trn2", "legacy", tol)


def _matches_reference(entry_size, block_size, target, api, tol):
    """R + P = 576 (R = 512) in 576- and 640-element entries, B = 16/32/64, trn1 and trn2; 512-key
    tiles so three sequences cover full tiles, partial tiles, one-token contexts and a short
    prefill chunk."""
    batch = make_mla_batch(1, [1, 3, 1], [1, 700, 1100], H=16, block_size=block_size,
                           entry_size=entry_size)
    check(batch, tol, target=target, large_tile_size=512, api=api)


@pytest.mark.parametrize("H, mixed_precision, api", [
    (16, True, "nki"), (16, False, "nki"), (128, True, "nki"), (128, False, "nki"),
    (16, True, "legacy"),
], ids=["16-mixed_bf16", "16-fp32", "128-mixed_bf16", "128-fp32", "16-mixed_bf16-legacy"])
def test_mixed_prefill_and_decode_batch(H, mixed_precision, api, tol):
    """Prefill chunks with and without earlier context next to decodes, one of them over two
    2048-key tiles (a FULL item carried through the partial phase); at H = 128 a 5-token chunk is
    640 query rows (5 row blocks; fp32 splits them over groups by the SBUF budget)."""
    dtype = BF16 if mixed_precision else np.float32
    batch = make_mla_batch(2, [5, 1, 2, 1], [5, 2100, 302, 1], H=H, block_size=32,
                           entry_size=576, dtype=dtype)
    check(batch, tol, mixed_precision=mixed_precision, api=api)


@pytest.mark.parametrize("rank, rope", [(96, 32), (200, 60)])
def test_other_latent_sizes(rank, rope, tol):
    """R + P = 128 (one channel slice) and 260 (a 4-channel last slice), R not a multiple of 128."""
    batch = make_mla_batch(3, [2, 1], [40, 90], H=16, block_size=16, entry_size=rank + rope + 8,
                           R=rank, P=rope)
    check(batch, tol, kv_lora_rank=rank, qk_rope_head_dim=rope, large_tile_size=512)


def test_softmax_scale_and_torch_in_torch_out(tol):
    torch = pytest.importorskip("torch")
    q, cache, bt, ql, cl = make_mla_batch(4, [1, 2], [30, 60], H=16, block_size=16, entry_size=640)
    ref = mla_paged_attention_ref(q, cache, bt, ql, cl, softmax_scale=0.07)
    tq = torch.from_numpy(q.view(np.int16).copy()).view(torch.bfloat16)
    tc = torch.from_numpy(cache.view(np.int16).copy()).view(torch.bfloat16)
    out = mla_paged_attention(tq, tc, torch.from_numpy(bt), torch.from_numpy(ql),
                              torch.from_numpy(cl), softmax_scale=0.07, backend="sim")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    err = np.abs(out.float().numpy().astype(np.float64) - ref).max()
    assert err <= tol("mixed", BF16)[0]


@pytest.mark.parametrize("api", ["legacy", "nki"])
@pytest.mark.parametrize("entry_size", [576, 640])
def test_garbage_in_unused_cache_never_reaches_the_output(entry_size, api, tol):
    """NaN in every element no sequence owns -- entry padding, block tails, spare blocks -- and
    huge ids in unused block-table entries: the output equals the clean-cache output bit for bit
    (masked keys get probability exactly 0, unused memory is never gathered or never read)."""
    args = ([1, 4, 1], [17, 45, 33])
    clean = make_mla_batch(5, *args, H=16, block_size=16, entry_size=entry_size)
    dirty = make_mla_batch(5, *args, H=16, block_size=16, entry_size=entry_size, fill=np.nan)
    bt = dirty[2].copy()
    bt[bt < 0] = 10 ** 9
    assert np.isnan(dirty[1].astype(np.float32)).sum() > 0
    out_clean = check(clean, tol, large_tile_size=512, api=api)
    out_dirty = check((dirty[0], dirty[1], bt, dirty[3], dirty[4]), tol, large_tile_size=512,
                      api=api)
    assert np.array_equal(out_clean.view(np.uint16), out_dirty.view(np.uint16))


def test_inputs_are_never_modified():
    q, cache, bt, ql, cl = make_mla_batch(6, [2, 1], [20, 40], H=16, block_size=16, entry_size=640,
                                          fill=np.nan)
    before = [a.copy() for a in (q, cache, bt, ql, cl)]
    mla_paged_attention(q, cache, bt, ql, cl, backend="sim", large_tile_size=512)
    for a, b in zip((q, cache, bt, ql, cl), before):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("api", ["legacy", "nki"])
def test_one_gather_per_row_tile_and_padding_moves_no_bytes(api):
    """Decode batch, 512-key tiles (b' = 4): every key row crosses HBM exactly once -- one
    descriptor of b' whole entries (keys and values alike) per row of ceil(context / b') -- so
    there is no second (value) gather, and padding items / rows move nothing."""
    clens = [1, 130, 515, 1100, 64]
    q, cache, bt, ql, cl = make_mla_batch(7, [1] * 5, clens, H=16, block_size=16, entry_size=640)
    with nki_sim.tracing() as trace:
        mla_paged_attention(q, cache, bt, ql, cl, backend="sim", large_tile_size=512, api=api)
    bp, row_bytes = 4, 4 * 640 * 2
    gathers = [e for e in trace.events if e.engine == "dma" and e.dma_kind == "indirect"
               and tuple(e.out_shape) == (128, bp * 640)]
    descriptors = [b for e in gathers for b in e.descriptor_bytes]
    assert set(descriptors) == {row_bytes}
    assert len(descriptors) == sum(-(-c // bp) for c in clens)
    # The only other indirect reads are carried state rows ((R + 2) x 4 B; decode blocks get
    # their Q^T with the metadata): no separate value gather.
    other = {b for e in trace.events if e.engine == "dma" and e.dma_kind == "indirect"
             and e.dst_buffer == "sbuf" and e not in gathers for b in e.descriptor_bytes}
    assert other == {(R + 2) * 4}


@pytest.mark.parametrize("arg, value, match", [
    ("q", "width", r"^q must have shape \(T, H, kv_lora_rank \+ qk_rope_head_dim = 576\)"),
    ("q", "heads", r"^q must have 1 <= H <= 128"),
    ("kv_cache", "small_entry", r"^kv_cache must have entries of >= kv_lora_rank"),
    ("kv_cache", "dtype", r"^kv_cache.dtype must equal q.dtype"),
    ("kv_cache", "block_size", r"^kv_cache must have a block size .* power of two"),
    ("block_tables", "range", r"^block_tables must hold block ids"),
    ("context_lens", "short", r"^context_lens must be >= query_lens"),
    ("query_lens", "sum", r"^query_lens must sum to q.shape\[0\]"),
    ("mixed_precision", 1, r"^mixed_precision must be a bool"),
    ("backend", "gpu", r"^backend must be one of"),
    ("large_tile_size", 1000, r"^large_tile_size must be a power of two in \[512, 8192\]"),
    ("softmax_scale", float("inf"), r"^softmax_scale must be a finite real number"),
    ("api", "neuron", r"^api must be one of \('auto', 'legacy', 'nki'\); got 'neuron'"),
])
def test_bad_inputs_raise_value_error_before_anything_runs(arg, value, match, monkeypatch):
    import host.mla.mla_attention

    def no_launch(*a, **k):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr(host.mla.mla_attention, "launch_kernel", no_launch)
    q, cache, bt, ql, cl = make_mla_batch(8, [2, 1], [20, 40], H=16, block_size=16, entry_size=576)
    args = dict(q=q, kv_cache=cache, block_tables=bt, query_lens=ql, context_lens=cl)
    kw = dict(backend="sim")
    if arg == "q":
        args["q"] = q[:, :, :575] if value == "width" else np.zeros((3, 129, 576), q.dtype)
    elif arg == "kv_cache":
        args["kv_cache"] = {"small_entry": cache[:, :, :575], "dtype": cache.astype(np.float32),
                            "block_size": np.zeros((8, 24, 576), q.dtype)}[value]
    elif arg == "block_tables":
        args["block_tables"] = np.where(bt == bt[0, 0], cache.shape[0], bt)
    elif arg == "context_lens":
        args["context_lens"] = np.array([1, 40])
    elif arg == "query_lens":
        args["query_lens"] = np.array([1, 1])
    else:
        kw[arg] = value
    with pytest.raises(ValueError, match=match):
        mla_paged_attention(**args, **kw)


def test_unsupported_requests_raise_not_implemented_error():
    q, cache, bt, ql, cl = make_mla_batch(9, [1], [20], H=16, block_size=16, entry_size=704,
                                          R=640, P=64)
    with pytest.raises(NotImplementedError, match=r"kv_lora_rank = 640 > 512"):
        mla_paged_attention(q, cache, bt, ql, cl, kv_lora_rank=640, backend="sim")
    q, cache, bt, ql, cl = make_mla_batch(9, [1], [20], H=16, block_size=16, entry_size=576,
                                          dtype=np.float32)
    with pytest.raises(NotImplementedError, match=r"large_tile_size=8192 .* SBUF"):
        mla_paged_attention(q, cache, bt, ql, cl, large_tile_size=8192, mixed_precision=False,
                            backend="sim")


@pytest.mark.parametrize("target, api, want", [("trn2", "legacy", "legacy"), ("trn2", "nki", "nki"),
                                               ("trn1", None, "legacy")])
def test_the_requested_api_runs(monkeypatch, target, api, want, tol):
    """api= reaches the launch: the kernel family is jitted / launched for that API only."""
    from nki_kernels.ops import KernelFamily

    asked = []
    real = KernelFamily.for_api

    def spy(self, name):
        asked.append(name)
        return real(self, name)

    monkeypatch.setattr(KernelFamily, "for_api", spy)
    batch = make_mla_batch(4, [1, 2], [30, 60], H=16, block_size=16, entry_size=640)
    check(batch, tol, target=target, large_tile_size=512, api=api)
    assert asked and set(asked) == {want}


@pytest.mark.parametrize("api", ["nki", "legacy"])
def test_two_cores_split_the_query_groups(api, tol):
    """LNC 2 on trn2 (the latent cache is one KV head): each core runs its part of every class's
    items (docs/layouts.md §16.3 "Item parts"); both match the reference, NaN in every slot no
    query may see included, and the modeled launch (the slower core) is shorter."""
    from nki_sim import cost

    batch = make_mla_batch(21, [1, 1, 5, 1, 1], [700, 1500, 300, 90, 1100], H=16, block_size=32,
                           entry_size=576, fill=np.nan)
    traces = {}
    for lnc in (1, 2):
        with nki_sim.tracing() as traces[lnc]:
            check(batch, tol, api=api, large_tile_size=512, lnc=lnc)
    assert {lnc: {e.attr("core", 0) for e in traces[lnc].events} for lnc in (1, 2)} == {
        1: {0}, 2: {0, 1}}
    one, two = (cost.estimate_cores(traces[n], "trn2").launch_us for n in (1, 2))
    assert two < 0.8 * one
    with pytest.raises(NotImplementedError, match="trn1 logical core is one NeuronCore"):
        check(batch, tol, target="trn1", lnc=2)
