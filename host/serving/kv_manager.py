"""Paged KV-cache manager: block allocation, block tables and slot mappings for a running batch.

Pure NumPy bookkeeping (no kernels run here except the copy-on-write block copies, which go
through :func:`host.copy_blocks` when a cache is attached). One lock guards all state, so
several threads may allocate, append, fork and free concurrently.

Model (N blocks of B token slots each, docs/layouts.md §14):

* every sequence owns a block table: its i-th logical block holds token positions
  [i*B, (i+1)*B); ``slot(pos) = table[pos // B] * B + pos % B`` (the ``slot_mapping`` of
  :func:`host.reshape_and_cache`, the ``block_tables`` rows of :func:`host.paged_attention`);
* a block may be referenced by several sequences (``refcount`` > 1): after :meth:`fork`
  (all blocks) or through prefix sharing (full blocks whose tokens, and all tokens before them,
  are identical). Shared blocks are read-only: appending to a sequence whose last block is
  partial and shared first copies that block to a fresh one (copy-on-write);
* a block with refcount 0 is on the free list; allocation takes from its head, release appends.

Prefix sharing: a full block becomes shareable once :meth:`mark_computed` says its K/V are in
the cache; it is keyed by (the block id before it, its B token ids), which identifies the whole
prefix exactly (no hashing, no collisions) because a shared block is only ever held together
with the blocks before it. :meth:`add_sequence` attaches the longest matching chain of full
blocks, at most ``(len(prompt) - 1) // B`` of them so at least one prompt token is computed.

    mgr = KVCacheManager(num_blocks=64, block_size=16, kv_caches=caches)
    cached = mgr.add_sequence("a", prompt)           # prompt tokens already in the cache
    slots = mgr.append_slots("a", token_ids=prompt[cached:])
    reshape_and_cache(k, v, caches[layer], slots); ...; mgr.mark_computed("a")
    bt = mgr.block_tables(["a", "b"])                # (S, max_blocks) int32, -1 padded
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Hashable, Iterable, Sequence

import numpy as np

from host.validation import check_int, fail

__all__ = ["KVCacheManager", "OutOfBlocksError"]

_ROOT = -1  # parent id of a sequence's first block in the prefix table


class OutOfBlocksError(RuntimeError):
    """Not enough free blocks for the request; raised before any state changes."""


class KVCacheManager:
    """Block allocator and block tables over a paged cache of ``num_blocks`` x ``block_size`` slots.

    Args:
        num_blocks: N >= 1.  block_size: B >= 1.
        kv_caches: optional cache the blocks live in, anything :func:`host.copy_blocks` accepts
            (a list of (2, N, Hkv, B, d) per-layer caches or one (L, 2, N, Hkv, B, d) array or
            CPU torch tensor; MLA caches (N, B, E) / (L, N, B, E) alike), checked at construction
            with ``host.cache.cache_ops.copy_layers`` (writable, C-contiguous, distinct layers). With it,
            copy-on-write copies run immediately through ``host.copy_blocks``; without it they
            queue up for :meth:`pop_block_copies`. A copy that raises changes nothing.
        prefix_sharing: share full prompt blocks between sequences with the same prefix.
    """

    def __init__(self, num_blocks: int, block_size: int, *, kv_caches: Any = None,
                 prefix_sharing: bool = True) -> None:
        self.num_blocks = check_int("num_blocks", num_blocks, min_value=1)
        self.block_size = check_int("block_size", block_size, min_value=1)
        if kv_caches is not None:
            _check_cache_geometry(kv_caches, self.num_blocks, self.block_size)
            from host.cache.cache_ops import copy_layers

            copy_layers(kv_caches)      # a cache copy-on-write cannot copy in fails here, not later
        self._caches = kv_caches
        self._prefix_sharing = bool(prefix_sharing)
        self._lock = threading.RLock()
        self._free: deque[int] = deque(range(self.num_blocks))
        self._ref = np.zeros(self.num_blocks, dtype=np.int64)
        self._tables: dict[Hashable, list[int]] = {}
        self._lens: dict[Hashable, int] = {}
        self._tokens: dict[Hashable, list[int] | None] = {}   # None: token ids unknown
        self._computed: dict[Hashable, int] = {}              # full blocks published/checked
        self._prefix: dict[tuple[int, tuple[int, ...]], int] = {}
        self._key_of: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._pending: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ queries

    @property
    def num_free_blocks(self) -> int:
        with self._lock:
            return len(self._free)

    def free_blocks(self) -> list[int]:
        """The free list, head (next allocated) first."""
        with self._lock:
            return list(self._free)

    def refcount(self, block: int) -> int:
        """Number of block-table entries (over all sequences) naming ``block``."""
        b = check_int("block", block, min_value=0, max_value=self.num_blocks - 1)
        with self._lock:
            return int(self._ref[b])

    @property
    def sequences(self) -> tuple[Hashable, ...]:
        with self._lock:
            return tuple(self._tables)

    def num_tokens(self, seq_id: Hashable) -> int:
        """Token positions allocated to ``seq_id`` (its next token goes to this position)."""
        with self._lock:
            return self._lens[self._seq(seq_id)]

    def block_table(self, seq_id: Hashable) -> np.ndarray:
        """(ceil(num_tokens / B),) int32 block ids of ``seq_id`` in token order."""
        with self._lock:
            return np.asarray(self._tables[self._seq(seq_id)], dtype=np.int32)

    def block_tables(self, seq_ids: Sequence[Hashable], *, width: int | None = None) -> np.ndarray:
        """(S, width) int32 block tables of ``seq_ids`` (row order kept), padded with -1.

        ``width`` defaults to the longest table (at least 1).
        """
        with self._lock:
            tables = [self._tables[self._seq(s)] for s in seq_ids]
            need = max([len(t) for t in tables] + [1])
            w = need if width is None else check_int("width", width, min_value=need)
            out = np.full((len(tables), w), -1, dtype=np.int32)
            for i, t in enumerate(tables):
                out[i, :len(t)] = t
            return out

    def slot_mapping(self, seq_id: Hashable, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(stop - start,) int64 cache slots of positions [start, stop) of ``seq_id``."""
        with self._lock:
            sid = self._seq(seq_id)
            n = self._lens[sid]
            stop = n if stop is None else check_int("stop", stop, min_value=0, max_value=n)
            start = check_int("start", start, min_value=0, max_value=stop)
            return self._slots(sid, start, stop)

    # ------------------------------------------------------------------ updates

    def add_sequence(self, seq_id: Hashable, prompt_token_ids: Iterable[int] | None = None) -> int:
        """Register a new, empty sequence; with prefix sharing, attach cached prompt blocks.

        Returns the number of prompt tokens whose K/V are already in the cache (a multiple of
        B, < len(prompt)); their positions are allocated and the caller appends the rest.
        """
        prompt = None if prompt_token_ids is None else _token_list(prompt_token_ids)
        with self._lock:
            if seq_id in self._tables:
                fail("seq_id", "not name a live sequence", repr(seq_id))
            table: list[int] = []
            if self._prefix_sharing and prompt:
                parent, B = _ROOT, self.block_size
                for i in range((len(prompt) - 1) // B):
                    blk = self._prefix.get((parent, tuple(prompt[i * B:(i + 1) * B])))
                    if blk is None:
                        break
                    table.append(blk)
                    parent = blk
            for blk in table:
                self._ref[blk] += 1
            n = len(table) * self.block_size
            self._tables[seq_id] = table
            self._lens[seq_id] = n
            self._tokens[seq_id] = None if prompt is None else prompt[:n]
            self._computed[seq_id] = len(table)
            return n

    def append_slots(self, seq_id: Hashable, num_tokens: int | None = None, *,
                     token_ids: Iterable[int] | None = None) -> np.ndarray:
        """Allocate the next positions of ``seq_id``; return their (n,) int64 cache slots.

        Give either ``num_tokens`` or ``token_ids`` (the tokens, needed for prefix sharing; a
        sequence appended without them is never shared by prefix). New blocks come from the
        free list; a partial last block shared with another sequence is first copied to a
        private one (copy-on-write, ``host.copy_blocks`` or :meth:`pop_block_copies`).

        Raises:
            ValueError: unknown sequence, both or neither of num_tokens / token_ids.
            OutOfBlocksError: too few free blocks (nothing is changed).
        """
        toks = None if token_ids is None else _token_list(token_ids)
        if (num_tokens is None) == (toks is None):
            fail("append_slots", "get exactly one of num_tokens and token_ids",
                 f"num_tokens={num_tokens!r}, token_ids={'given' if toks is not None else None}")
        n = len(toks) if toks is not None else check_int("num_tokens", num_tokens, min_value=0)
        with self._lock:
            sid = self._seq(seq_id)
            table, start, B = self._tables[sid], self._lens[sid], self.block_size
            if n == 0:
                return np.zeros(0, dtype=np.int64)
            cow = start % B != 0 and self._ref[table[-1]] > 1
            new_blocks = -(-(start + n) // B) - len(table)
            if new_blocks + cow > len(self._free):
                raise OutOfBlocksError(f"append_slots({seq_id!r}, {n}) needs {new_blocks + cow} free "
                                       f"blocks; {len(self._free)} of {self.num_blocks} are free")
            if cow:
                # copy into the next free block BEFORE anything changes: a copy that raises
                # leaves the manager exactly as it was (the sequence keeps its shared block)
                old, new = table[-1], self._free[0]
                self._copy(old, new)
                self._take()
                self._ref[old] -= 1
                table[-1] = new
            table.extend(self._take() for _ in range(new_blocks))
            self._lens[sid] = start + n
            if self._tokens[sid] is not None and toks is not None:
                self._tokens[sid].extend(toks)
            else:
                self._tokens[sid] = None
            return self._slots(sid, start, start + n)

    def mark_computed(self, seq_id: Hashable) -> None:
        """Declare that every allocated position of ``seq_id`` has its K/V written.

        Its full blocks then become shareable by prefix (if its token ids are known).
        """
        with self._lock:
            sid = self._seq(seq_id)
            table, toks, B = self._tables[sid], self._tokens[sid], self.block_size
            full = self._lens[sid] // B
            if self._prefix_sharing and toks is not None:
                for i in range(self._computed[sid], full):
                    blk = table[i]
                    if blk in self._key_of:
                        continue
                    key = (table[i - 1] if i else _ROOT, tuple(toks[i * B:(i + 1) * B]))
                    if key not in self._prefix:
                        self._prefix[key] = blk
                        self._key_of[blk] = key
            self._computed[sid] = full

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """New sequence ``child_id`` sharing all of ``parent_id``'s blocks (refcounts + 1)."""
        with self._lock:
            pid = self._seq(parent_id)
            if child_id in self._tables:
                fail("child_id", "not name a live sequence", repr(child_id))
            self._tables[child_id] = list(self._tables[pid])
            for blk in self._tables[child_id]:
                self._ref[blk] += 1
            self._lens[child_id] = self._lens[pid]
            toks = self._tokens[pid]
            self._tokens[child_id] = None if toks is None else list(toks)
            self._computed[child_id] = self._computed[pid]

    def free(self, seq_id: Hashable) -> None:
        """Drop ``seq_id``; blocks no other sequence references return to the free list."""
        with self._lock:
            sid = self._seq(seq_id)
            for blk in reversed(self._tables.pop(sid)):
                self._ref[blk] -= 1
                if self._ref[blk] == 0:
                    key = self._key_of.pop(blk, None)
                    if key is not None:
                        del self._prefix[key]
                    self._free.append(blk)
            del self._lens[sid], self._tokens[sid], self._computed[sid]

    def pop_block_copies(self) -> np.ndarray:
        """(n, 2) int64 [src, dst] copy-on-write copies queued since the last call.

        Only used without an attached cache; run them with ``host.copy_blocks`` (in order, before
        the next cache write) on every layer.
        """
        with self._lock:
            out = np.asarray(self._pending, dtype=np.int64).reshape(-1, 2)
            self._pending.clear()
            return out

    # ------------------------------------------------------------------ internals

    def _seq(self, seq_id: Hashable) -> Hashable:
        if seq_id not in self._tables:
            fail("seq_id", "name a live sequence (add_sequence or fork it first)", repr(seq_id))
        return seq_id

    def _take(self) -> int:
        blk = self._free.popleft()
        self._ref[blk] = 1
        return blk

    def _copy(self, src: int, dst: int) -> None:
        if self._caches is None:
            self._pending.append((src, dst))
            return
        from host.cache.cache_ops import copy_blocks

        copy_blocks(self._caches, np.array([[src, dst]], dtype=np.int64))

    def _slots(self, sid: Hashable, start: int, stop: int) -> np.ndarray:
        pos = np.arange(start, stop, dtype=np.int64)
        table = np.asarray(self._tables[sid], dtype=np.int64)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size


def _token_list(token_ids: Iterable[int]) -> list[int]:
    arr = np.asarray(list(token_ids) if not isinstance(token_ids, np.ndarray) else token_ids)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        fail("token_ids", "be a 1-D sequence of integers", f"shape {arr.shape}, dtype {arr.dtype}")
    return [int(t) for t in arr]


def _check_cache_geometry(kv_caches: Any, num_blocks: int, block_size: int) -> None:
    """The attached cache must have N blocks of B slots: paged (..., 2, N, Hkv, B, d) per layer
    (5-D, or 6-D for all layers) or MLA (..., N, B, E) (3-D, or 4-D)."""
    listed = isinstance(kv_caches, (list, tuple))
    for i, c in enumerate(kv_caches if listed else [kv_caches]):
        shape = tuple(getattr(c, "shape", ()))
        paged = len(shape) in (5, 6) and shape[-5] == 2
        n = shape[-4] if paged else shape[-3] if len(shape) in (3, 4) else None
        if n != num_blocks or shape[-2] != block_size:
            fail(f"kv_caches[{i}]" if listed else "kv_caches",
                 f"have shape (..., 2, num_blocks={num_blocks}, Hkv, block_size={block_size}, d) "
                 f"or MLA (..., {num_blocks}, {block_size}, E)", f"shape {shape}")
