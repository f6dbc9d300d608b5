"""The dense kernel keeps one sequence's non-finite data out of every other sequence's output.

A dense batch's 128-row Q tile holds many sequences' rows, and two of the kernel's instructions
mix them: P V (``0 * NaN`` is NaN) and, on NeuronCore-v2, the PE transposes (a non-finite
element spreads along its transposed row). ``nki_kernels.dense.finite`` keeps non-finite values
out of both. Here NaN / Inf is put into ONE sequence's new query, key or value, or into a
cached key / value its query sees: every other sequence's output must be bit-identical to the
clean run, and the owner's rows that see the fault NaN (the float64 reference is non-finite
there too). Must-fail sides: with the checks replaced by plain copies the same batches leak.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nki_sim
from host import paged_attention, paged_attention_ref
from nki_kernels.dense import finite, flash_paged_attention, kv_load

pytestmark = [pytest.mark.simulation,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
PAIRS = [("trn1", "legacy"), ("trn2", "legacy"), ("trn2", "nki")]
H, HKV, D, B, N = 4, 2, 16, 16, 10
QLENS, CLENS = [3, 1, 1], [20, 7, 33]
TABLE = np.array([[1, 2, -1], [3, -1, -1], [4, 5, 6]], np.int32)
OWNER = 1                                  # the poisoned sequence: token 3, cache block 3
# where the fault goes: (array, index); every one is seen by the owner's only query row
FAULTS = {
    "query": ("q", (3, 1, 5)),             # one query head of the owner's token
    "new_key": ("k", (3, 0, 2)),
    "new_value": ("v", (3, 1, 7)),
    "cached_key": ("cache", (0, 3, 0, 2, 4)),    # block 3 = the owner's context, token 2 < 7
    "cached_value": ("cache", (1, 3, 1, 5, 0)),
}


def _batch():
    rng = np.random.default_rng(29)
    T = sum(QLENS)
    return dict(q=rng.uniform(-1, 1, (T, H, D)).astype(np.float32),
                k=rng.uniform(-1, 1, (T, HKV, D)).astype(np.float32),
                v=rng.uniform(-1, 1, (T, HKV, D)).astype(np.float32),
                cache=rng.uniform(-1, 1, (2, N, HKV, B, D)).astype(np.float32))


def _run(b, target, api, mixed):
    with nki_sim.use_target(target):
        return np.asarray(paged_attention(b["q"], b["k"], b["v"], b["cache"], TABLE, QLENS, CLENS,
                                          kernel="dense", backend="sim", api=api,
                                          mixed_precision=mixed, large_tile_size=512))


def _rows(seq):
    start = sum(QLENS[:seq])
    return slice(start, start + QLENS[seq])


def _poisoned(fault, value):
    b = _batch()
    name, idx = FAULTS[fault]
    b[name] = b[name].copy()
    b[name][idx] = value
    return b


def _others_identical(out, clean):
    return all(out[_rows(s)].tobytes() == clean[_rows(s)].tobytes()
               for s in range(len(QLENS)) if s != OWNER)


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "fp32"])
@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("target, api", PAIRS)
def test_a_sequences_fault_stays_in_its_own_rows(target, api, fault, value, mixed, tol):
    clean = _run(_batch(), target, api, mixed)
    c = _batch()
    ref = paged_attention_ref(c["q"], c["k"], c["v"], c["cache"], TABLE, QLENS, CLENS)
    np.testing.assert_allclose(clean, ref, atol=tol("mixed" if mixed else "fp32", np.float32)[0])
    b = _poisoned(fault, value)
    out = _run(b, target, api, mixed)
    assert _others_identical(out, clean)
    # the owner's rows that see the fault: NaN, or -- where the reference itself stays finite
    # (an infinite key whose scores are -inf: exp gives 0) -- the reference's value
    got = out[_rows(OWNER)][:, _heads_seeing(fault)]
    want = paged_attention_ref(b["q"], b["k"], b["v"], b["cache"], TABLE, QLENS, CLENS)
    want = want[_rows(OWNER)][:, _heads_seeing(fault)]
    atol = tol("mixed" if mixed else "fp32", np.float32)[0]
    for h in range(got.shape[1]):        # query head by query head (the scores' sign varies)
        assert np.isnan(got[:, h]).all() or (np.isfinite(want[:, h]).all()
                                             and np.allclose(got[:, h], want[:, h], atol=atol))
    assert not np.isnan(np.delete(out[_rows(OWNER)], _heads_seeing(fault), axis=1)).any()


def _heads_seeing(fault):
    """The owner's query heads that see the fault (G = 2 query heads per KV head)."""
    name, idx = FAULTS[fault]
    if fault == "query":
        return [idx[1]]
    kv_head = idx[2] if name == "cache" else idx[1]
    return [2 * kv_head, 2 * kv_head + 1]


def _plain_values(ops, v_tile, *, head_size, kernel_dtype):
    """finite_values without its check: the values copied into the same layout, no fault."""
    d, P = head_size, v_tile.shape[0]
    n = v_tile.shape[1] // d
    w = finite.value_stride(d)
    out = ops.zeros((P, n * w), kernel_dtype)
    for k in range(n):
        ops.copy(out[:, ops.ds(k * w, d)], v_tile[:, ops.ds(k * d, d)])
    return out


@pytest.mark.parametrize("target, api", PAIRS)
def test_without_the_value_check_a_value_fault_leaks(target, api, monkeypatch):
    clean = _run(_batch(), target, api, True)
    monkeypatch.setattr(flash_paged_attention, "finite_values", _plain_values)
    out = _run(_poisoned("cached_value", np.nan), target, api, True)
    assert not _others_identical(out, clean)


def test_without_the_key_check_nc_v2_transposes_spread_a_key_fault(monkeypatch):
    clean = _run(_batch(), "trn1", "legacy", True)
    monkeypatch.setattr(kv_load, "finite_key_rows", lambda *a, **k: None)
    out = _run(_poisoned("cached_key", np.nan), "trn1", "legacy", True)
    assert not _others_identical(out, clean)
    # NeuronCore-v3's transposes move each element alone: the same fault stays put there
    out3 = _run(_poisoned("cached_key", np.nan), "trn2", "legacy", True)
    assert _others_identical(out3, _run(_batch(), "trn2", "legacy", True))


def test_without_the_query_check_nc_v2_transposes_spread_a_query_fault(monkeypatch):
    clean = _run(_batch(), "trn1", "legacy", True)
    monkeypatch.setattr(flash_paged_attention, "finite_columns",
                        lambda ops, x_t, ones, **k: _no_check(ops, x_t))
    out = _run(_poisoned("query", np.nan), "trn1", "legacy", True)
    assert not _others_identical(out, clean)


def _no_check(ops, x_t):
    """finite_columns without its check: nothing zeroed, every count 0."""
    counts = ops.psum((128, x_t.shape[1] // 128), ops.float32)
    zeros = ops.zeros((x_t.shape[0], 1), ops.float32)
    eye = ops.zeros((x_t.shape[0], x_t.shape[1]), ops.float32)
    for c in range(x_t.shape[1] // 128):
        ops.matmul(counts[:, ops.ds(c, 1)], eye[:, ops.ds(c * 128, 128)], zeros)
    return counts


# ---- random batches: any sequence, any fault site, any value -----------------------------------
_PAIR = st.sampled_from(PAIRS)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(lens=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 70)), min_size=2, max_size=5),
       pair=_PAIR, seed=st.integers(0, 2**16), value=st.sampled_from([np.nan, np.inf, -np.inf]),
       site=st.sampled_from(["q", "k", "v", "cache_k", "cache_v"]), mixed=st.booleans())
def test_random_faults_never_reach_another_sequence(lens, pair, seed, value, site, mixed):
    """Random batches (2-5 sequences of 1-40 new tokens on 0-70 cached ones, block 16): a
    fault at a random element of one sequence's query, new key / value, or of a cached key /
    value in one of its blocks, leaves every other sequence's output bit-identical."""
    target, api = pair
    rng = np.random.default_rng(seed)
    qlens, clens = [q for q, _ in lens], [c for _, c in lens]
    T, S, Hkv, H, d, B = sum(qlens), len(lens), 2, 4, 16, 16
    nb = [-(-c // B) for c in clens]
    N = sum(nb) + 2
    ids = rng.permutation(N)[:sum(nb)]
    table = np.full((S, max(max(nb), 1)), -1, np.int32)
    o = 0
    for i, n in enumerate(nb):
        table[i, :n] = ids[o:o + n]
        o += n
    arrays = dict(q=rng.uniform(-1, 1, (T, H, d)), k=rng.uniform(-1, 1, (T, Hkv, d)),
                  v=rng.uniform(-1, 1, (T, Hkv, d)), cache=rng.uniform(-1, 1, (2, N, Hkv, B, d)))
    arrays = {n: a.astype(np.float32) for n, a in arrays.items()}
    owner = int(rng.integers(S))
    if site.startswith("cache") and nb[owner] == 0:
        site = site[-1]                          # no cached block: its new key / value instead
    bad = {n: a.copy() for n, a in arrays.items()}
    if site.startswith("cache"):
        blk = table[owner, rng.integers(nb[owner])]
        bad["cache"][0 if site == "cache_k" else 1, blk, rng.integers(Hkv), rng.integers(B),
                     rng.integers(d)] = value
    else:
        tok = sum(qlens[:owner]) + int(rng.integers(qlens[owner]))
        a = bad[site]
        a[tok, rng.integers(a.shape[1]), rng.integers(d)] = value

    def run(x):
        with nki_sim.use_target(target):
            return np.asarray(paged_attention(x["q"], x["k"], x["v"], x["cache"], table, qlens,
                                              clens, kernel="dense", backend="sim", api=api,
                                              mixed_precision=mixed, large_tile_size=512))
    clean, out = run(arrays), run(bad)
    starts = np.cumsum([0] + qlens)
    for s in range(S):
        if s != owner:
            rows = slice(starts[s], starts[s + 1])
            assert out[rows].tobytes() == clean[rows].tobytes(), (s, owner, site)
