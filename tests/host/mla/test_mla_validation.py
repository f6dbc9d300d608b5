"""host.check_mla_inputs: the plan of a valid call, and one must-fail case per validation rule."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from host import MLAPlan, check_mla_inputs


def valid_args(dtype=np.float32, *, H=4, R=8, P=4, E=16, N=6, B=4):
    """3 sequences (prefill chunk of 3, two decodes); context_lens include the new tokens."""
    q = np.zeros((5, H, R + P), dtype)
    cache = np.zeros((N, B, E), dtype)
    bt = np.array([[0, 1, -1], [2, 3, 4], [5, -1, -1]])
    return dict(q=q, kv_cache=cache, block_tables=bt, query_lens=[3, 1, 1], context_lens=[7, 12, 1],
                kv_lora_rank=R, qk_rope_head_dim=P)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16], ids=lambda t: np.dtype(t).name)
def test_valid_inputs_give_the_plan(dtype):
    plan = check_mla_inputs(**valid_args(dtype))
    assert isinstance(plan, MLAPlan)
    assert (plan.num_tokens, plan.num_heads, plan.num_blocks, plan.block_size, plan.entry_size,
            plan.kv_lora_rank, plan.qk_rope_head_dim, plan.num_seqs) == (5, 4, 6, 4, 16, 8, 4, 3)
    assert plan.query_lens.tolist() == [3, 1, 1] and plan.context_lens.tolist() == [7, 12, 1]
    assert plan.query_offsets.tolist() == [0, 3, 4] and plan.context_blocks.tolist() == [2, 3, 1]
    assert plan.softmax_scale == 1 / math.sqrt(12) and plan.dtype == np.dtype(dtype).name
    with pytest.raises(AttributeError):
        plan.num_heads = 8                                         # frozen
    with pytest.raises(ValueError):
        plan.query_lens[0] = 9                                     # read-only arrays


def test_boundaries_accepted():
    """E == R + P (no padding), H = 1 and 128, an explicit scale, -1 after the used blocks."""
    args = valid_args(E=12)
    assert check_mla_inputs(**args).entry_size == 12
    for H in (1, 128):
        args = valid_args(H=H)
        assert check_mla_inputs(**args).num_heads == H
    assert check_mla_inputs(**valid_args(), softmax_scale=0.1).softmax_scale == 0.1
    assert check_mla_inputs(**{**valid_args(), "context_lens": [3, 1, 1]}).context_blocks.tolist() == [1, 1, 1]


def _case(name):
    a = valid_args()
    f = np.float32
    cases = {
        "q_not_float": ("q", dict(q=a["q"].astype(np.int32))),
        "q_rank": ("q", dict(q=a["q"][0])),
        "q_width": ("q", dict(q=np.zeros((5, 4, 13), f))),
        "q_dtype_f64": ("q.dtype", dict(q=a["q"].astype(np.float64))),
        "no_heads": ("q", dict(q=np.zeros((5, 0, 12), f))),
        "too_many_heads": ("q", dict(q=np.zeros((5, 129, 12), f))),
        "cache_rank": ("kv_cache", dict(kv_cache=np.zeros((2, 6, 4, 16), f))),
        "entry_too_small": ("kv_cache", dict(kv_cache=np.zeros((6, 4, 11), f))),
        "cache_dtype_mismatch": ("kv_cache.dtype", dict(kv_cache=a["kv_cache"].astype(ml_dtypes.bfloat16))),
        "cache_int": ("kv_cache.dtype", dict(kv_cache=a["kv_cache"].astype(np.int16))),
        "cache_empty": ("kv_cache", dict(kv_cache=np.zeros((0, 4, 16), f))),
        "rank_zero": ("kv_lora_rank", dict(kv_lora_rank=0)),
        "rank_not_int": ("kv_lora_rank", dict(kv_lora_rank=8.0)),
        "rope_zero": ("qk_rope_head_dim", dict(qk_rope_head_dim=0)),
        "query_lens_sum": ("query_lens", dict(query_lens=[3, 1, 2])),
        "query_lens_zero": ("query_lens", dict(query_lens=[4, 0, 1])),
        "query_lens_empty": ("query_lens", dict(query_lens=np.zeros(0, np.int64))),
        "query_lens_float": ("query_lens", dict(query_lens=[3.0, 1.0, 1.0])),
        "context_lens_count": ("context_lens", dict(context_lens=[7, 12])),
        "context_excludes_new": ("context_lens", dict(context_lens=[2, 12, 1])),
        "context_lens_2d": ("context_lens", dict(context_lens=[[7, 12, 1]])),
        "block_tables_rows": ("block_tables", dict(block_tables=a["block_tables"][:2])),
        "block_tables_cols": ("block_tables", dict(block_tables=a["block_tables"][:, :2])),
        "block_id_too_big": ("block_tables", dict(block_tables=np.array([[0, 6, -1], [2, 3, 4], [5, -1, -1]]))),
        "block_id_negative_used": ("block_tables", dict(block_tables=np.array([[0, 1, -1], [2, -1, 4], [5, -1, -1]]))),
        "block_tables_float": ("block_tables", dict(block_tables=a["block_tables"].astype(np.float32))),
        "scale_nan": ("softmax_scale", dict(softmax_scale=float("nan"))),
        "scale_str": ("softmax_scale", dict(softmax_scale="0.1")),
        "scale_bool": ("softmax_scale", dict(softmax_scale=True)),
    }
    arg, override = cases[name]
    return arg, {**a, **override}


RULES = ["q_not_float", "q_rank", "q_width", "q_dtype_f64", "no_heads", "too_many_heads", "cache_rank",
         "entry_too_small", "cache_dtype_mismatch", "cache_int", "cache_empty", "rank_zero", "rank_not_int",
         "rope_zero", "query_lens_sum", "query_lens_zero", "query_lens_empty", "query_lens_float",
         "context_lens_count", "context_excludes_new", "context_lens_2d", "block_tables_rows",
         "block_tables_cols", "block_id_too_big", "block_id_negative_used", "block_tables_float",
         "scale_nan", "scale_str", "scale_bool"]


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_rejects_naming_the_argument(rule):
    arg, args = _case(rule)
    with pytest.raises(ValueError, match=r"^" + arg.replace(".", r"\.") + r" must .*; got "):
        check_mla_inputs(**args)


def test_fp8_cache_is_unsupported_not_invalid():
    args = valid_args()
    args["kv_cache"] = np.zeros((6, 4, 16), ml_dtypes.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="float8_e4m3fn MLA cache"):
        check_mla_inputs(**args)


def test_message_names_constraint_and_value():
    _, args = _case("entry_too_small")
    with pytest.raises(ValueError, match=r"kv_lora_rank \+ qk_rope_head_dim = 12 .*entry size 11"):
        check_mla_inputs(**args)
    _, args = _case("context_excludes_new")
    with pytest.raises(ValueError, match=r"context_lens\[0\] = 2 < query_lens\[0\] = 3"):
        check_mla_inputs(**args)
    _, args = _case("too_many_heads")
    with pytest.raises(ValueError, match=r"H = 129"):
        check_mla_inputs(**args)


@pytest.mark.parametrize("module", ["host.mla.mla", "host.cache.mla_layout"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
