"""host.serving.kv_manager.KVCacheManager: hand-computed cases, model-based property tests of its
invariants, thread safety, and copy-on-write forks running the real cache kernels."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host.serving.kv_manager import KVCacheManager, OutOfBlocksError


def expected_slots(table, start, stop, B):
    """slot(pos) = block_table[pos // B] * B + pos % B, written out per position."""
    return [int(table[p // B]) * B + p % B for p in range(start, stop)]


def check_invariants(mgr: KVCacheManager) -> None:
    N, B = mgr.num_blocks, mgr.block_size
    counts = np.zeros(N, dtype=np.int64)
    for s in mgr.sequences:
        table = mgr.block_table(s).tolist()
        assert len(set(table)) == len(table), f"{s!r} holds a block twice: {table}"
        assert len(table) == -(-mgr.num_tokens(s) // B)
        for b in table:
            counts[b] += 1
        assert mgr.slot_mapping(s).tolist() == expected_slots(table, 0, mgr.num_tokens(s), B)
    refs = np.array([mgr.refcount(b) for b in range(N)])
    np.testing.assert_array_equal(refs, counts)   # a block in two tables is counted twice
    free = mgr.free_blocks()
    assert len(set(free)) == len(free)
    assert sorted(free) == [b for b in range(N) if counts[b] == 0]   # conservation
    assert mgr.num_free_blocks == len(free)


# ----------------------------------------------------------------------------- hand computed


def test_allocation_free_list_and_slots_hand_computed():
    mgr = KVCacheManager(num_blocks=6, block_size=4)
    assert mgr.add_sequence("a") == 0
    assert mgr.append_slots("a", 6).tolist() == [0, 1, 2, 3, 4, 5]
    mgr.add_sequence("b")
    assert mgr.append_slots("b", 3).tolist() == [8, 9, 10]
    assert mgr.block_tables(["b", "a"]).tolist() == [[2, -1], [0, 1]]
    assert mgr.block_tables(["a"], width=4).tolist() == [[0, 1, -1, -1]]
    mgr.free("a")
    assert mgr.free_blocks() == [3, 4, 5, 1, 0]
    mgr.add_sequence("c")
    assert mgr.append_slots("c", 9).tolist() == [12, 13, 14, 15, 16, 17, 18, 19, 20]
    assert mgr.slot_mapping("c", 7, 9).tolist() == [19, 20]
    assert mgr.append_slots("b", 1).tolist() == [11]          # fills block 2, no new block
    assert mgr.append_slots("b", 1).tolist() == [4]           # next block: 1 (free-list head)
    check_invariants(mgr)


def test_prefix_sharing_hand_computed():
    mgr = KVCacheManager(num_blocks=8, block_size=2)
    mgr.add_sequence("a", [1, 2, 3, 4, 5])
    mgr.append_slots("a", token_ids=[1, 2, 3, 4, 5])          # blocks 0, 1, 2
    assert mgr.add_sequence("early", [1, 2, 3, 4, 9]) == 0    # not computed yet: nothing shared
    mgr.free("early")
    mgr.mark_computed("a")                                    # full blocks 0, 1 shareable
    assert mgr.add_sequence("b", [1, 2, 3, 4, 9]) == 4
    assert mgr.block_table("b").tolist() == [0, 1]
    assert mgr.add_sequence("c", [1, 2, 3]) == 2              # at most (3 - 1) // 2 blocks
    assert mgr.add_sequence("d", [1, 2]) == 0                 # one prompt token must be computed
    assert mgr.add_sequence("e", [2, 2, 3, 4, 5]) == 0        # first block differs
    assert [mgr.refcount(b) for b in (0, 1, 2)] == [3, 2, 1]
    mgr.free("a")
    mgr.free("b")
    mgr.free("c")
    assert mgr.add_sequence("f", [1, 2, 3, 4, 5]) == 0        # blocks freed: entries dropped
    check_invariants(mgr)


def test_fork_copy_on_write_queues_copies_without_a_cache():
    mgr = KVCacheManager(num_blocks=6, block_size=4)
    mgr.add_sequence("p")
    mgr.append_slots("p", 6)                                  # blocks 0, 1 (1 is half full)
    mgr.fork("p", "c")
    assert [mgr.refcount(b) for b in (0, 1)] == [2, 2]
    assert mgr.append_slots("c", 1).tolist() == [2 * 4 + 2]    # copy of block 1 -> block 2
    assert mgr.pop_block_copies().tolist() == [[1, 2]]
    assert mgr.append_slots("p", 1).tolist() == [1 * 4 + 2]    # block 1 is p's alone now
    assert mgr.pop_block_copies().shape == (0, 2)
    mgr.append_slots("p", 1)
    mgr.fork("p", "c2")                                       # p has 8 tokens: last block full
    assert mgr.append_slots("c2", 1).tolist() == [3 * 4]       # a new block, nothing copied
    assert mgr.pop_block_copies().shape == (0, 2)
    check_invariants(mgr)


def test_out_of_blocks_changes_nothing():
    mgr = KVCacheManager(num_blocks=3, block_size=2)
    mgr.add_sequence("a")
    mgr.append_slots("a", 3)
    mgr.fork("a", "b")
    before = (mgr.free_blocks(), mgr.block_table("b").tolist(), mgr.num_tokens("b"))
    with pytest.raises(OutOfBlocksError, match="needs 2 free blocks; 1 of 3"):
        mgr.append_slots("b", 2)                              # copy-on-write + one new block
    assert (mgr.free_blocks(), mgr.block_table("b").tolist(), mgr.num_tokens("b")) == before
    assert mgr.pop_block_copies().shape == (0, 2)
    check_invariants(mgr)


def test_bad_arguments_raise_value_error_naming_them():
    mgr = KVCacheManager(num_blocks=4, block_size=2)
    mgr.add_sequence("a")
    with pytest.raises(ValueError, match="seq_id must not name a live sequence"):
        mgr.add_sequence("a")
    with pytest.raises(ValueError, match="seq_id must name a live sequence"):
        mgr.append_slots("zz", 1)
    with pytest.raises(ValueError, match="append_slots must get exactly one"):
        mgr.append_slots("a", 1, token_ids=[3])
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        mgr.append_slots("a", -1)
    with pytest.raises(ValueError, match="token_ids must be a 1-D sequence of integers"):
        mgr.append_slots("a", token_ids=[0.5])
    with pytest.raises(ValueError, match="child_id must not name a live sequence"):
        mgr.fork("a", "a")
    with pytest.raises(ValueError, match="num_blocks must be >= 1"):
        KVCacheManager(0, 2)
    with pytest.raises(ValueError, match=r"kv_caches must have shape \(\.\.\., 2, num_blocks=4"):
        KVCacheManager(4, 2, kv_caches=np.zeros((2, 5, 1, 2, 8), np.float32))
    with pytest.raises(ValueError, match=r"kv_caches\[1\] must have shape .* or MLA \(\.\.\., 4, 2, E\)"):
        KVCacheManager(4, 2, kv_caches=[np.zeros((4, 2, 8)), np.zeros((4, 3, 8))])
    KVCacheManager(4, 2, kv_caches=[np.zeros((4, 2, 8), np.float32) for _ in range(2)])   # MLA
    KVCacheManager(4, 2, kv_caches=np.zeros((3, 2, 4, 1, 2, 8), np.float32))  # (L, 2, N, Hkv, B, d)
    # caches copy-on-write could not copy in are rejected here, not at the first copy
    with pytest.raises(ValueError, match="kv_caches must hold distinct, non-overlapping layers"):
        KVCacheManager(4, 2, kv_caches=[np.zeros((4, 2, 8), np.float32)] * 2)
    with pytest.raises(ValueError, match=r"kv_caches\[0\] must have dtype in"):
        KVCacheManager(4, 2, kv_caches=np.zeros((3, 2, 4, 1, 2, 8)))       # float64
    with pytest.raises(ValueError, match="kv_caches must be C-contiguous"):
        KVCacheManager(4, 2, kv_caches=np.zeros((3, 2, 4, 1, 2, 8), np.float32)[::-1])
    mgr.append_slots("a", 3)
    with pytest.raises(ValueError, match="width must be >= 2"):
        mgr.block_tables(["a"], width=1)
    with pytest.raises(ValueError, match="stop must be <= 3"):
        mgr.slot_mapping("a", 0, 4)


# ----------------------------------------------------------------------------- properties

OPS = st.lists(st.tuples(st.sampled_from(["add", "append", "append", "fork", "free", "mark"]),
                         st.integers(0, 7), st.lists(st.sampled_from([0, 0, 0, 1]), min_size=1, max_size=9)),
               min_size=4, max_size=40)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(4, 16))
def test_manager_matches_a_model_of_the_cache(ops, block_size, num_blocks):
    """Random programs of add / append / fork / free / mark_computed (an op on sequence i acts on
    live sequence i mod #live; with none live it is an add). A model cache of token ids (N, B)
    is written at the returned slots and updated with the copy-on-write copies; every sequence
    must read its own token history back through its slot mapping, writes must only hit blocks
    the sequence holds alone, and the invariants of ``check_invariants`` hold after every op."""
    B = block_size
    mgr = KVCacheManager(num_blocks, B)
    content = np.full((num_blocks, B), -1, dtype=np.int64)
    history: dict[int, list[int]] = {}
    new_ids = iter(range(10**6))

    def readback(s):
        slots = mgr.slot_mapping(s)
        return content[slots // B, slots % B].tolist()

    def append(s, toks):
        try:
            slots = mgr.append_slots(s, token_ids=toks)
        except OutOfBlocksError:
            return False
        for src, dst in mgr.pop_block_copies():
            content[dst] = content[src]
        assert all(mgr.refcount(int(b)) == 1 for b in slots // B)   # never write a shared block
        content[slots // B, slots % B] = toks
        history[s].extend(toks)
        return True

    for op, i, toks in ops:
        live = sorted(history)
        if op == "add" or not live:
            s = next(new_ids)
            cached = mgr.add_sequence(s, toks)
            assert cached % B == 0 and cached < len(toks)
            history[s] = list(toks[:cached])
            assert readback(s) == history[s]                       # shared prefix content
            if append(s, toks[cached:]):
                mgr.mark_computed(s)
            else:
                mgr.free(s)
                del history[s]
            continue
        s = live[i % len(live)]
        if op == "append":
            append(s, toks)
        elif op == "fork":
            child = next(new_ids)
            mgr.fork(s, child)
            history[child] = list(history[s])
        elif op == "free":
            mgr.free(s)
            del history[s]
        else:
            mgr.mark_computed(s)
        for other in history:
            assert readback(other) == history[other]
        check_invariants(mgr)
    for s in list(history):
        mgr.free(s)
    assert sorted(mgr.free_blocks()) == list(range(num_blocks))


def test_concurrent_threads_keep_the_invariants():
    """Four threads add, append, fork and free on one manager (shared prompts, so blocks are
    shared across threads); the books balance afterwards and everything returns to the free list."""
    mgr = KVCacheManager(num_blocks=48, block_size=2)
    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6, 7], [9, 9, 9]]
    barrier = threading.Barrier(4)
    errors = []

    def worker(tid):
        rng = np.random.default_rng(100 + tid)
        live = []
        try:
            barrier.wait()
            for i in range(150):
                op = rng.integers(4)
                if op == 0 or not live:
                    sid = (tid, i)
                    p = prompts[rng.integers(len(prompts))]
                    c = mgr.add_sequence(sid, p)
                    try:
                        mgr.append_slots(sid, token_ids=p[c:])
                        mgr.mark_computed(sid)
                        live.append(sid)
                    except OutOfBlocksError:
                        mgr.free(sid)
                elif op == 1:
                    try:
                        mgr.append_slots(live[rng.integers(len(live))], int(rng.integers(1, 4)))
                    except OutOfBlocksError:
                        pass
                elif op == 2:
                    child = (tid, i, "fork")
                    mgr.fork(live[rng.integers(len(live))], child)
                    live.append(child)
                else:
                    mgr.free(live.pop(int(rng.integers(len(live)))))
            mgr.pop_block_copies()
        except Exception as e:  # surfaced below
            errors.append(e)
        finally:
            return live

    results = [None] * 4
    threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, worker(k)))
               for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    check_invariants(mgr)
    for live in results:
        for sid in live:
            mgr.free(sid)
    assert sorted(mgr.free_blocks()) == list(range(48))
    assert all(mgr.refcount(b) == 0 for b in range(48))
