"""torch op nki_pa::paged_attention with vLLM's block-KV cache (kv_cache = the key cache and
value_cache = the value cache, (N, B, Hkv, d) each): numerics against the float64 reference,
the launch reads the tensors' own storage, torch.library.opcheck, and the XLA device path's
refusal (it reads fused caches only)."""

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


def test_xla_path_refuses_the_pair(monkeypatch):
    monkeypatch.setattr(torch_neuron, "toolchain_status", lambda api=None: (True, "simulated for a test"))
    b = make_batch(3)
    a, v = op_args(b)
    with pytest.raises(NotImplementedError, match=r"block-KV pair .* needs CPU tensors"):
        torch_neuron._paged_attention_xla(*a, value_cache=v)
