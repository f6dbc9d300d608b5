"""Helpers for the flash paged-attention kernel tests: random flat batches and the comparison
against the float64 reference (host.reference.paged_attention_ref)."""

from __future__ import annotations

import importlib.util
import pathlib
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest


def _root_tolerance():
    """``tolerance`` from tests/conftest.py (the one tolerance table), loaded by path because
    every conftest module is named ``conftest`` (no packages under tests/)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "conftest.py"
    spec = importlib.util.spec_from_file_location("_nki_pa_root_conftest", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.tolerance


tolerance = _root_tolerance()


@dataclass
class Batch:
    query: np.ndarray          # (T, H, d)
    key: np.ndarray            # (T, Hkv, d)
    value: np.ndarray          # (T, Hkv, d)
    kv_cache: np.ndarray       # (2, N, Hkv, B, d)
    block_tables: np.ndarray   # (S, max_blocks) int32; unused entries -1
    query_lens: np.ndarray     # (S,)
    context_lens: np.ndarray   # (S,)

    def args(self):
        return (self.query, self.key, self.value, self.kv_cache, self.block_tables,
                self.query_lens, self.context_lens)


def make_batch(seed, query_lens, context_lens, *, H, Hkv, d, block_size, dtype=np.float32,
               spare_blocks=2, max_blocks_extra=1) -> Batch:
    """Random batch: values U[-1, 1] (as vLLM's tests), cache blocks a random permutation of
    [0, N) with ``spare_blocks`` unused blocks, unused block-table entries -1."""
    rng = np.random.default_rng(seed)
    qlens = np.asarray(query_lens, dtype=np.int64)
    clens = np.asarray(context_lens, dtype=np.int64)
    T = int(qlens.sum())
    nblk = -(-clens // block_size)
    N = int(nblk.sum()) + spare_blocks
    perm = rng.permutation(N)
    width = int(nblk.max()) + max_blocks_extra
    bt = np.full((len(qlens), width), -1, dtype=np.int32)
    off = 0
    for i, n in enumerate(nblk.tolist()):
        bt[i, :n] = perm[off:off + n]
        off += n
    dt = np.dtype(dtype)

    def u(*shape):
        return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32).astype(dt)

    return Batch(u(T, H, d), u(T, Hkv, d), u(T, Hkv, d), u(2, N, Hkv, block_size, d), bt, qlens, clens)


def unseen_slots_poisoned(batch: Batch, value=np.nan) -> np.ndarray:
    """A copy of ``batch.kv_cache`` with ``value`` in every cache slot no query may see: each
    sequence's last block past its context and every block no sequence's table uses."""
    B = batch.kv_cache.shape[3]
    dirty = batch.kv_cache.copy()
    used = set()
    for i, ci in enumerate(np.asarray(batch.context_lens).tolist()):
        blocks = batch.block_tables[i, :-(-ci // B)]
        used.update(blocks.tolist())
        if len(blocks):
            dirty[:, blocks[-1], :, ci % B or B:] = value
    dirty[:, [k for k in range(dirty.shape[1]) if k not in used]] = value
    return dirty


def max_abs_err(out, ref) -> float:
    return float(np.max(np.abs(np.asarray(out, dtype=np.float64) - np.asarray(ref, dtype=np.float64))))


KERNELS = ("dense", "scheduled")


def assert_matches_reference(batch: Batch, *, mixed_precision=True, large_tile_size=2048,
                             softmax_scale=None, gqa_packing=False, kernels=KERNELS, **options):
    """Run host.paged_attention on nki_sim with every kernel in ``kernels`` (both by default:
    every numerical test holds for the dense and the scheduled kernel) and compare with the
    float64 reference using the project tolerance table; the message reports the kernel and the
    worst sequence and head. ``options`` (variant keywords) go to both calls.

    ``gqa_packing`` defaults to False so the kernel matrix exercises the dense kernel's own GQA
    path (G query heads per KV head); the host-side packing has its own tests
    (test_gqa_packing.py). Returns ``(out, ref)`` of the last kernel."""
    from host.reference import paged_attention_ref

    ref = paged_attention_ref(*batch.args(), softmax_scale=softmax_scale, **options)
    out = None
    for kernel in kernels:
        out = _check_one(batch, ref, kernel, mixed_precision, large_tile_size, softmax_scale,
                         gqa_packing, options)
    return out, ref


def _check_one(batch, ref, kernel, mixed_precision, large_tile_size, softmax_scale, gqa_packing,
               options):
    from host.attention import paged_attention

    packing = dict(gqa_packing=gqa_packing) if kernel == "dense" else {}
    out = paged_attention(*batch.args(), softmax_scale=softmax_scale,
                          mixed_precision=mixed_precision, large_tile_size=large_tile_size,
                          backend="sim", kernel=kernel, **packing, **options)
    assert out.shape == ref.shape and out.dtype == batch.query.dtype
    atol, rtol = tolerance("mixed" if mixed_precision else "fp32", batch.query.dtype)
    err = np.abs(out.astype(np.float64) - ref)
    bound = atol + rtol * np.abs(ref)
    if not np.all(err <= bound):
        tok, head, _ = np.unravel_index(int(np.argmax(err - bound)), err.shape)
        seq = int(np.searchsorted(np.cumsum(batch.query_lens), tok, side="right"))
        pytest.fail(f"{kernel} kernel: max |err| {err.max():.3e} > atol {atol} at token {tok} "
                    f"(sequence {seq}, context {int(batch.context_lens[seq])}, query "
                    f"{int(batch.query_lens[seq])}), head {head}")
    return out


def kernel_inputs(batch: Batch, *, large_tile_size, pad_blocks_to=None, pad_queries_to=None):
    """``(plan, (query, key, value, kv_cache, block_tables, mask))`` in the kernel layouts, built
    with the host helpers as host.paged_attention does (optionally with padded buckets)."""
    from host.dense.block_tables import active_block_table
    from host.dense.masks import build_attention_mask
    from host.dense.plan import make_plan

    plan = make_plan(batch.query_lens, batch.context_lens, block_size=batch.kv_cache.shape[3],
                     large_tile_size=large_tile_size, pad_blocks_to=pad_blocks_to,
                     pad_queries_to=pad_queries_to)
    T, H, d = batch.query.shape
    Hkv, Qpad, dt = batch.key.shape[1], plan.padded_queries, batch.query.dtype
    q = np.zeros((1, H, d, Qpad), dt)
    q[0, :, :, :T] = batch.query.transpose(1, 2, 0)
    k = np.zeros((1, Hkv, d, Qpad), dt)
    k[0, :, :, :T] = batch.key.transpose(1, 2, 0)
    v = np.zeros((1, Hkv, Qpad, d), dt)
    v[0, :, :T] = batch.value.transpose(1, 0, 2)
    bt = active_block_table(plan, batch.block_tables)
    return plan, (q, k, v, batch.kv_cache, bt, build_attention_mask(plan))


BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def build_kernel_inputs():
    """``kernel_inputs(batch, *, large_tile_size, pad_blocks_to=None, pad_queries_to=None)``."""
    return kernel_inputs


@pytest.fixture
def batch_factory():
    """``make_batch(seed, query_lens, context_lens, *, H, Hkv, d, block_size, dtype=...)``."""
    return make_batch


@pytest.fixture
def poison_unseen():
    """``unseen_slots_poisoned(batch, value=nan)``: the batch's cache with ``value`` in every slot
    no query may see."""
    return unseen_slots_poisoned


@pytest.fixture
def check_reference():
    """``assert_matches_reference(batch, *, mixed_precision, large_tile_size, softmax_scale)``."""
    return assert_matches_reference


@pytest.fixture
def one_core(monkeypatch):
    """Launches at LNC 1 (``NEURON_LOGICAL_NC_CONFIG=1``): a test that counts one launch's
    instructions or bytes, which a trn2 launch at the platform's LNC 2 splits between two cores."""
    from nki_kernels import toolchain

    monkeypatch.setenv(toolchain.LNC_ENV, "1")


@pytest.fixture(autouse=True)
def _block_dimensions_are_errors():
    """The project's kernels must compile on Neuron SDK >= 2.25, where block dimensions are an
    error: make them an error whatever SDK a test simulates (nki_sim's default follows the
    simulated SDK, which only warns up to 2.24)."""
    import nki_sim
    with nki_sim.configure(block_dims="error"):
        yield


@pytest.fixture
def keep_item_order(monkeypatch):
    """The host keeps partial items ordered by group and tile (``row_nesting.nested_order``
    off), so a later item may write fewer KV rows than an earlier one and the partial phase
    zeroes its tiles per item (``SchedOptions.nested_rows`` False)."""
    from host.scheduled import schedule
    monkeypatch.setattr(schedule, "nested_order", lambda items, written: list(items))


@pytest.fixture
def on_api(monkeypatch):
    """``on_api(api, target="trn2")``: the scheduled kernel's launches in this test run on
    ``api`` ("legacy" | "nki", through ``NKI_PA_API``) for ``target``; returns the target
    context to enter."""
    import nki_sim
    from nki_kernels import toolchain

    def set_(api, target="trn2"):
        monkeypatch.setenv(toolchain.API_ENV, api)
        return nki_sim.use_target(target)
    return set_
