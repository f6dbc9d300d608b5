"""Faults a user hits, each as a must-fail case that now fails cleanly (or no longer fails):
dense-kernel garbage in slots no query may see, a copy-on-write copy that raises, tensors on
mismatched devices, token ids outside the vocabulary, the generation default."""

from __future__ import annotations

import numpy as np
import pytest

from host import KVCacheManager, paged_attention, paged_attention_ref

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


# ----------------------------------------------------------------------------- dense kernel
@pytest.mark.simulation
@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_dense_kernel_padding_pointing_at_block_0_cannot_poison_the_batch(poison, tol):
    # contexts end inside blocks (tails) and the active table pads with block 0, which no
    # sequence owns; NaN / Inf there used to turn every output NaN
    rng = np.random.default_rng(3)
    H, Hkv, d, B, N = 4, 2, 16, 16, 10
    qlens, clens = [3, 1, 1], [20, 7, 33]
    bt = np.array([[1, 2, -1], [3, -1, -1], [4, 5, 6]], np.int32)
    T = sum(qlens)
    q = rng.uniform(-1, 1, (T, H, d)).astype(np.float32)
    k = rng.uniform(-1, 1, (T, Hkv, d)).astype(np.float32)
    v = rng.uniform(-1, 1, (T, Hkv, d)).astype(np.float32)
    cache = rng.uniform(-1, 1, (2, N, Hkv, B, d)).astype(np.float32)
    clean = paged_attention(q, k, v, cache, bt, qlens, clens, kernel="dense", backend="sim",
                            large_tile_size=512, mixed_precision=False)
    bad = cache.copy()
    bad[:, 0] = poison                                   # padding entries of the active table
    bad[:, 2, :, 20 - 16:] = poison                      # tail of seq 0's last block
    bad[:, 3, :, 7:] = poison
    bad[:, 6, :, 1:] = poison
    out = paged_attention(q, k, v, bad, bt, qlens, clens, kernel="dense", backend="sim",
                          large_tile_size=512, mixed_precision=False)
    assert out.tobytes() == clean.tobytes()
    ref = paged_attention_ref(q, k, v, cache, bt, qlens, clens)
    np.testing.assert_allclose(out, ref, atol=tol("fp32", np.float32)[0])


# ----------------------------------------------------------------------------- KV cache manager
def test_a_failing_copy_on_write_leaves_the_manager_unchanged(monkeypatch):
    import host.cache.cache_ops

    caches = host.cache.cache_ops.allocate_kv_caches(2, 6, 1, 4, 8, np.float32)
    mgr = KVCacheManager(6, 4, kv_caches=caches)
    mgr.add_sequence("a")
    mgr.append_slots("a", 6)                     # blocks [0, 1], the last one partial
    mgr.fork("a", "b")
    before = (mgr.block_table("b").tolist(), mgr.free_blocks(), mgr.refcount(1), mgr.num_tokens("b"))

    def broken(*a, **k):
        raise RuntimeError("device lost")

    monkeypatch.setattr(host.cache.cache_ops, "copy_blocks", broken)
    with pytest.raises(RuntimeError, match="device lost"):
        mgr.append_slots("b", 1)                 # copy-on-write of block 1 fails
    assert (mgr.block_table("b").tolist(), mgr.free_blocks(), mgr.refcount(1),
            mgr.num_tokens("b")) == before
    monkeypatch.undo()
    caches[0][:, 1] = 7.0                        # history in the shared block
    slots = mgr.append_slots("b", 1)             # the retry copies the history
    new = mgr.block_table("b")[-1]
    assert new != 1 and slots.tolist() == [new * 4 + 2]
    assert (caches[0][:, new] == 7.0).all() and mgr.refcount(1) == 1


def test_a_cache_copy_on_write_cannot_use_is_rejected_at_construction():
    torch = pytest.importorskip("torch")
    cache = torch.zeros(2, 6, 2, 1, 4, 8).transpose(1, 2)       # (L, 2, N, Hkv, B, d), strided
    assert not cache.is_contiguous()
    with pytest.raises(ValueError, match="kv_caches must be contiguous"):
        KVCacheManager(6, 4, kv_caches=cache)
    with pytest.raises(ValueError, match="kv_caches must be C-contiguous"):
        KVCacheManager(6, 4, kv_caches=np.zeros((2, 2, 6, 1, 4, 8), np.float32)[:, :, ::-1])


# ----------------------------------------------------------------------------- torch devices
def _torch_batch(torch):
    q = torch.zeros(3, 4, 8)
    kv = torch.zeros(3, 2, 8)
    cache = torch.zeros(2, 4, 2, 4, 8)
    return q, kv, cache, torch.zeros(1, 4, dtype=torch.int32), torch.tensor([3]), torch.tensor([5])


def test_torch_ops_reject_a_meta_cache_next_to_cpu_tensors():
    torch = pytest.importorskip("torch")
    import host.serving.torch_ops  # noqa: F401

    q, kv, cache, bt, ql, cl = _torch_batch(torch)
    meta = torch.empty_like(cache, device="meta")
    with pytest.raises(ValueError, match=r"kv_cache must be on the device of query \(cpu\) "
                                         r"\(a meta tensor has no data.*got meta"):
        torch.ops.nki_pa.paged_attention(q, kv, kv, meta, bt, ql, cl)
    with pytest.raises(ValueError, match=r"kv_cache must be on the device of key \(cpu\)"):
        torch.ops.nki_pa.reshape_and_cache(kv, kv, meta, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"block_mapping must be on the device of kv_caches"):
        torch.ops.nki_pa.copy_blocks(meta, torch.tensor([[0, 1]]))
    # all-meta calls trace shapes only
    out = torch.ops.nki_pa.paged_attention(*(t.to("meta") for t in (q, kv, kv, cache, bt, ql, cl)))
    assert out.device.type == "meta" and out.shape == q.shape


# ----------------------------------------------------------------------------- generation
def _tiny_llama(torch):
    transformers = pytest.importorskip("transformers")
    import host.serving.hf_backend as hf

    hf.register()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=64)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="nki_paged").eval()


def test_generate_rejects_token_ids_outside_the_vocabulary():
    torch = pytest.importorskip("torch")
    from host.serving.generation import PagedGenerator

    gen = PagedGenerator(_tiny_llama(torch), num_blocks=8, block_size=4)
    for bad in (64, -1):
        with pytest.raises(ValueError, match=r"prompt must hold token ids in \[0, vocab_size=64\)"):
            gen.add_request([1, 2, bad], max_new_tokens=2)
    assert not gen.has_unfinished


def test_generation_defaults_to_the_precision_that_matches_eager():
    import inspect

    pytest.importorskip("torch")
    from host.serving.generation import PagedGenerator
    from host.serving.hf_backend import PagedBatch

    assert inspect.signature(PagedGenerator).parameters["mixed_precision"].default is False
    assert PagedBatch.__dataclass_fields__["mixed_precision"].default is False
