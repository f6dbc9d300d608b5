"""torch ops nki_pa::paged_attention and nki_pa::reshape_and_cache with vLLM's block-KV cache
(kv_cache = the key cache and value_cache = the value cache, (N, B, Hkv, d) each): the write in
place against NumPy slot indexing, attention numerics against the float64 reference,
the launch reads the tensors' own storage, torch.library.opcheck, and the XLA device path (on a
simulated launch: the same kernel and inputs as on the CPU; its overlay gathers equal the host's,
garbage in unseen slots kept out)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import host.attention as attention  # noqa: E402
import host.serving.torch_ops  # noqa: E402,F401  (registers the ops)
from host import paged_attention_ref  # noqa: E402
from host.serving import torch_neuron  # noqa: E402

pytestmark = pytest.mark.simulation
H, HKV, D, B, N = 4, 2, 16, 8, 12


def make_batch(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    u = lambda *s: (torch.rand(s, generator=g) * 2 - 1).to(dtype)  # noqa: E731
    vllm = u(2, N, B, HKV, D)                  # vLLM's per-layer tensor; .unbind(0) -> the pair
    bt = torch.tensor([[3, 7, -1], [1, -1, -1], [9, 2, 5]], dtype=torch.int32)
    return dict(query=u(5, H, D), key=u(5, HKV, D), value=u(5, HKV, D), vllm=vllm,
                block_tables=bt, query_lens=torch.tensor([3, 1, 1]),
                context_lens=torch.tensor([10, 0, 17]))


def reference(b):
    f = lambda t: t.float().numpy()  # noqa: E731
    fused = f(b["vllm"]).transpose(0, 1, 3, 2, 4)
    return paged_attention_ref(f(b["query"]), f(b["key"]), f(b["value"]), fused,
                               b["block_tables"].numpy(), b["query_lens"].numpy(),
                               b["context_lens"].numpy())


def op_args(b):
    k, v = b["vllm"].unbind(0)
    return (b["query"], b["key"], b["value"], k, b["block_tables"], b["query_lens"],
            b["context_lens"]), v


@pytest.mark.parametrize("dtype, mode", [(torch.float32, "fp32"), (torch.bfloat16, "mixed")])
def test_op_with_value_cache_matches_reference_and_reads_the_tensors_in_place(dtype, mode, tol,
                                                                             monkeypatch):
    b = make_batch(1, dtype)
    seen = []
    real = attention.launch_kernel

    def spy(kernel, args, kwargs, **kw):
        # the key cache: a class launch's third argument, a pair launch's fifteenth
        seen.append((args[2] if len(args) == 9 else args[14], kwargs["value_cache"]))
        return real(kernel, args, kwargs, **kw)

    monkeypatch.setattr(attention, "launch_kernel", spy)
    a, v = op_args(b)
    out = torch.ops.nki_pa.paged_attention(*a, mixed_precision=mode == "mixed",
                                           large_tile_size=512, value_cache=v)
    assert out.dtype == dtype and out.shape == b["query"].shape
    atol, rtol = tol(mode, "bfloat16" if dtype == torch.bfloat16 else "float32")
    np.testing.assert_allclose(out.float().numpy(), reference(b), atol=atol, rtol=rtol)
    assert seen
    for k_arg, v_arg in seen:               # the pair's own storage reaches every launch
        assert k_arg.ctypes.data == a[3].data_ptr() and v_arg.ctypes.data == v.data_ptr()


def test_opcheck_with_value_cache():
    b = make_batch(2)
    a, v = op_args(b)
    torch.library.opcheck(torch.ops.nki_pa.paged_attention.default, a,
                          dict(mixed_precision=False, large_tile_size=512, value_cache=v))


def test_xla_path_reads_the_pair(simulated_device, tol):
    from nki_kernels.scheduled.scheduled_attention import scheduled_paged_attention

    b = make_batch(3)
    a, v = op_args(b)
    out = torch_neuron._paged_attention_xla(*a, mixed_precision=False, large_tile_size=512,
                                            value_cache=v)
    np.testing.assert_allclose(out.numpy(), reference(b), atol=tol("fp32", "float32")[0])
    cpu = torch.ops.nki_pa.paged_attention(*a, mixed_precision=False, large_tile_size=512,
                                           value_cache=v)
    assert torch.equal(out, cpu)                     # the same kernel and inputs as on the CPU
    assert simulated_device and {k for k, _ in simulated_device} == {scheduled_paged_attention}
    with pytest.raises(NotImplementedError, match="reads a fused"):
        torch_neuron._paged_attention_xla(*a, value_cache=v, attention_kernel="dense")


@pytest.mark.parametrize("pair", [False, True])
def test_device_overlay_equals_the_host_overlay_and_keeps_garbage_out(pair):
    from host.scheduled.schedule import make_schedule
    from host.scheduled.scheduled import build_overlay
    from host.scheduled.scheduled_index import overlay_index

    b = make_batch(4)
    vllm = b["vllm"].clone()
    bt = b["block_tables"].numpy()
    ql, cl = b["query_lens"].numpy(), b["context_lens"].numpy()
    seen = np.zeros((N, B), bool)                     # cache slots some query may see
    for i, c in enumerate(cl):
        for pos in range(c):
            seen[bt[i, pos // B], pos % B] = True
    vllm[:, ~torch.from_numpy(seen)] = float("nan")   # garbage everywhere no query may look
    k_cache, v_cache = vllm.unbind(0)
    cache = (k_cache, v_cache) if pair else vllm.permute(0, 1, 3, 2, 4).contiguous()
    sched = make_schedule(ql, cl, bt, num_heads=H, num_kv_heads=HKV, head_size=D, block_size=B,
                          num_blocks=N, large_tile_size=512)
    T = int(ql.sum())
    new = torch.stack([b["key"], b["value"]]).reshape(2, T * HKV, D)
    ov = overlay_index(sched, bt, num_blocks=N, num_tokens=T)
    got = torch_neuron._device_overlay(ov, cache, new, pair, torch.from_numpy)
    host_cache = (k_cache.numpy(), v_cache.numpy()) if pair else cache.numpy()
    want = build_overlay(sched, host_cache, b["key"].numpy(), b["value"].numpy(), bt)
    assert np.isfinite(want).all()
    assert got.numpy().tobytes() == want.tobytes()


def _written(b, slots):
    """vLLM's (2, N, B, Hkv, d) layer tensor after writing the batch's new K / V at ``slots``
    (NumPy slot indexing)."""
    want = b["vllm"].clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            want[0, s // B, s % B] = b["key"][t]
            want[1, s // B, s % B] = b["value"][t]
    return want


def test_reshape_and_cache_op_writes_the_pair_in_place():
    b = make_batch(5)
    slots = torch.tensor([3, 90, -1, 17, 41])
    k, v = b["vllm"].clone().unbind(0)
    torch.ops.nki_pa.reshape_and_cache(b["key"], b["value"], k, slots, value_cache=v)
    assert torch.equal(torch.stack([k, v]), _written(b, slots))
    k2, v2 = b["vllm"].clone().unbind(0)
    torch.library.opcheck(torch.ops.nki_pa.reshape_and_cache.default,
                          (b["key"], b["value"], k2, slots), dict(value_cache=v2))


def test_xla_path_writes_the_pair(simulated_device):
    from nki_kernels.cache.kv_cache_update import kv_cache_update_blocks

    b = make_batch(6)
    slots = torch.tensor([7, -1, 60, 33, 2])
    k, v = b["vllm"].clone().unbind(0)
    torch_neuron._reshape_and_cache_xla(b["key"], b["value"], k, slots, value_cache=v)
    assert torch.equal(torch.stack([k, v]), _written(b, slots))
    assert simulated_device == [(kv_cache_update_blocks, None)]
    with pytest.raises(ValueError, match="kv_cache / value_cache must be two"):
        torch_neuron._reshape_and_cache_xla(b["key"], b["value"], k, slots, value_cache=v[:4])


def test_copy_blocks_op_copies_blocks_of_vllms_layer_tensor():
    # a block is the same contiguous slab in vLLM's (2, N, B, Hkv, d) layer tensor as in the
    # fused (2, N, Hkv, B, d) layout, so the op copies vLLM's tensors whole blocks at a time
    b = make_batch(7)
    layers = torch.stack([b["vllm"], -b["vllm"]])                    # (L, 2, N, B, Hkv, d)
    want = layers.clone()
    want[:, :, 5] = layers[:, :, 2]
    want[:, :, 0] = layers[:, :, 9]
    torch.ops.nki_pa.copy_blocks(layers, torch.tensor([[2, 5], [9, 0]]))
    assert torch.equal(layers, want)


def test_xla_path_refuses_overlapping_key_and_value_caches(simulated_device):
    b = make_batch(8)
    k, v = b["vllm"].clone().unbind(0)           # two halves of one tensor: no overlap, accepted
    torch_neuron._reshape_and_cache_xla(b["key"], b["value"], k, torch.arange(5), value_cache=v)
    base = torch.cat([k, k[:1]])                  # views one block apart: they overlap
    for first, other in ((k, k), (base[:-1], base[1:])):
        before = first.clone()
        with pytest.raises(ValueError, match="kv_cache / value_cache must be non-overlapping"):
            torch_neuron._reshape_and_cache_xla(b["key"], b["value"], first, torch.arange(5),
                                                value_cache=other)
        assert torch.equal(first, before)
    assert len(simulated_device) == 1


def test_device_write_back_copies_a_returned_tensor_without_comparing_pointers():
    # an XLA custom call returns a NEW tensor whose data_ptr() is 0 (or raises) like the cache's:
    # the write-back must copy it anyway
    class NoStorage(torch.Tensor):
        def data_ptr(self):
            return 0

    cache = torch.zeros(4).as_subclass(NoStorage)
    torch_neuron._write_back(cache, torch.arange(4.0).as_subclass(NoStorage))
    assert torch.equal(cache.as_subclass(torch.Tensor), torch.arange(4.0))
    same = torch.ones(3)
    torch_neuron._write_back(same, same)                # the cache itself: nothing to copy
    assert torch.equal(same, torch.ones(3))
