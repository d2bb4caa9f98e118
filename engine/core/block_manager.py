"""Paged KV-cache blocks with reference counts and a hash-chained prefix cache (torch-free).

A block's hash chains its parent's hash with its token ids, so equal hashes name equal prefixes.
Full blocks are offered to the cache when they are scheduled (their tokens are known then, and the
runner writes each layer's KV before that layer's attention reads it, so a request scheduled in the
same step may already share them). Freed blocks keep their contents and stay reusable until their
space is needed: blocks are handed out never-used first, then freed blocks holding nothing
cacheable, then cached blocks least recently freed first.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict

from xxhash import xxh3_64_intdigest

from engine.core.config import cdiv
from engine.core.sequence import Sequence

ROOT_HASH = 0  # the parent hash of every sequence's first block


def hash_block(parent_hash: int, token_bytes: bytes) -> int:
    # Chained through the seed: building parent + tokens (a copy of the whole block) cost as much as the hash itself,
    # ~1.6 % of simulate()'s instructions (sharegpt at 40 req/s; Azure 1.5 %). (prefix_block_hashes inlines this:
    # change both together)
    return xxh3_64_intdigest(token_bytes, parent_hash)


def token_bytes(token_ids: list[int] | array) -> bytes:
    """Token ids as the prefix cache hashes and compares them: int32, native order."""
    if isinstance(token_ids, array) and token_ids.typecode == "i":
        return token_ids.tobytes()
    return array("i", token_ids).tobytes()


def prefix_block_hashes(token_ids: list[int] | array, block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (the same values a Sequence's blocks get)."""
    hashes: list[int] = []
    parent = ROOT_HASH
    data = token_bytes(token_ids)  # converted once, sliced per block
    block_bytes = block_size * 4
    # hash_block inlined: a fleet's router hashes every prompt, a call a block was ~0.25 % of a 64-replica run's
    # instructions
    for start in range(0, len(token_ids) // block_size * block_bytes, block_bytes):
        parent = xxh3_64_intdigest(data[start : start + block_bytes], parent)
        hashes.append(parent)
    return hashes


def decode_steps_to_new_block(seq: Sequence, block_size: int) -> int:
    """For a decoding ``seq``: the step (0 = the next one) whose token opens a block, one it must be given; it
    computes token ``len(block_table) * block_size + 1`` then, and every ``block_size`` steps after. (QuietRun's
    constructor inlines this and ``decode_steps_to_full_block`` for each sequence of a window: change them together.)"""
    return max(len(seq.block_table) * block_size - seq.num_computed_tokens, 0)


def decode_steps_to_full_block(num_computed_tokens: int, num_registered_blocks: int, block_size: int) -> int:
    """For a decoding sequence with these counts: the step (0 = the next one) whose token fills the block after its
    registered ones, which is then offered to the prefix cache; every ``block_size`` steps after."""
    return (num_registered_blocks + 1) * block_size - 1 - num_computed_tokens


def prefix_caches(block_managers: list[BlockManager]) -> list[dict[int, int]]:
    """The block managers' prefix caches (block hash -> block id), for ``holders_of_block``: each manager keeps its one
    dict for its lifetime, so a router may take them once per fleet."""
    return [manager._cached for manager in block_managers]


def holders_of_block(caches: list[dict[int, int]], block_hash: int) -> list[int]:
    """The indices of the prefix caches (``prefix_caches``) that hold ``block_hash``: a fleet's router probes every
    replica for each request, and most lack the prompt's first block, so one pass over the caches answers most of
    them."""
    return [index for index, cache in enumerate(caches) if block_hash in cache]


class BlockManager:
    """Owns block ids ``0 .. num_blocks-1``. "Can't allocate" is a ``False`` return, never an exception."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Per-block state grows as blocks are first handed out, so a huge (effectively unbounded) cache costs
        # nothing up front.
        self.ref_counts: list[int] = []
        self.block_hashes: list[int | None] = []
        self._block_tokens: list[bytes | None] = []
        self._num_ever_used = 0
        # Blocks referenced by some sequence, and those that can be handed out now (cached-but-unreferenced ones
        # included): num_blocks in all. Counts kept as blocks are taken and freed, not properties: the step log and a
        # quiet window's planner read them every step and window, a property call each ~0.7 % of a 64-replica fleet's
        # instructions.
        self.num_used_blocks = 0
        self.num_free_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict()  # freed blocks, evicted from the head
        self._cached: dict[int, int] = {}  # block hash -> block id
        self.num_queried_tokens = 0  # prompt tokens looked up in the prefix cache at admission
        self.num_hit_tokens = 0  # ... and of those, tokens served from it
        # The prefix hits of a sequence allocate could not admit, kept for when it is asked again (find_cached_prefix):
        # (sequence, blocks asked for, hit block ids, their tokens, the _num_uncached they were found at); and how many
        # times a block has left the cache.
        self._prefix_memo: tuple[Sequence, int, list[int], list[bytes], int] | None = None
        self._num_uncached = 0

    # ---- capacity -------------------------------------------------------------------------------
    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def num_blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # ---- prefix cache ---------------------------------------------------------------------------
    def _token_bytes(self, seq: Sequence, index: int) -> bytes:
        start = index * self.block_size
        return token_bytes(seq.token_ids[start : start + self.block_size])

    def _block_hash(self, seq: Sequence, index: int) -> tuple[int, bytes]:
        """The chained hash and token bytes of the sequence's full block ``index`` (earlier hashes first)."""
        hashes = seq.block_hashes
        token_bytes = None
        while len(hashes) <= index:
            i = len(hashes)
            token_bytes = self._token_bytes(seq, i)
            hashes.append(hash_block(hashes[i - 1] if i else ROOT_HASH, token_bytes))
        if token_bytes is None:  # hashed on an earlier call
            token_bytes = self._token_bytes(seq, index)
        return hashes[index], token_bytes

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of ``seq``; at least one token is always left to compute.
        For a sequence ``allocate`` could not admit with them, the answer is remembered (see there)."""
        if not self.enable_prefix_caching:
            return []
        num_blocks = (len(seq.token_ids) - 1) // self.block_size
        memo = self._prefix_memo
        if memo is not None and memo[0] is seq and memo[1] == num_blocks:
            # The same waiting head asked again (it did not fit last step). Its earlier hits stand while their
            # blocks still hold the hashes and tokens they held then (surely so if nothing left the cache since);
            # only the walk past them is redone. Under KV pressure with a long prompt this is every step, and
            # re-hashing thousands of blocks was most of the step.
            _, _, hits, hit_tokens, num_uncached = memo
            if num_uncached != self._num_uncached and (
                list(map(self.block_hashes.__getitem__, hits)) != seq.block_hashes[: len(hits)]
                or list(map(self._block_tokens.__getitem__, hits)) != hit_tokens
            ):
                num_valid = self._num_still_cached(seq, hits, hit_tokens)
                hits, hit_tokens = hits[:num_valid], hit_tokens[:num_valid]
            num_known = len(hits)
            hits = hits[:]  # the caller may keep (and allocate) the list it gets: the memo keeps its own
            self._extend_cached_prefix(seq, hits, num_blocks)
            if len(hits) > num_known:
                hit_tokens = hit_tokens + [self._block_tokens[b] for b in hits[num_known:]]
            self._prefix_memo = (seq, num_blocks, hits[:], hit_tokens, self._num_uncached)
            return hits
        hits = []
        self._extend_cached_prefix(seq, hits, num_blocks)
        self._prefix_memo = None  # (allocate remembers these hits if it cannot admit seq with them)
        return hits

    def _remember_prefix(self, seq: Sequence, hits: list[int]) -> None:
        """``seq`` could not be admitted with ``hits``, find_cached_prefix's answer: remembered for the next time it is
        asked (most likely the next step), unless that answer came from the memo, brought up to date then. Kept only
        for such a sequence: most are admitted at once, and remembering every answer was ~0.6 % of a 64-replica
        fleet's instructions."""
        if self._prefix_memo is None and hits:  # (no hits: asked again, the walk starts from the first block anyway)
            self._prefix_memo = (seq, (len(seq.token_ids) - 1) // self.block_size, hits[:],
                                 list(map(self._block_tokens.__getitem__, hits)), self._num_uncached)

    def _num_still_cached(self, seq: Sequence, hits: list[int], hit_tokens: list[bytes]) -> int:
        """How many leading ``hits`` still hold the hash and tokens of ``seq``'s blocks they held when found. A block
        holds a hash only while the cache maps that hash to it; an evicted one holds none."""
        block_hashes = self.block_hashes
        block_tokens = self._block_tokens
        for index, block_id in enumerate(hits):
            if block_hashes[block_id] != seq.block_hashes[index] or block_tokens[block_id] != hit_tokens[index]:
                return index
        return len(hits)

    def _extend_cached_prefix(self, seq: Sequence, hits: list[int], num_blocks: int) -> None:
        """Append to ``hits`` (the first blocks of ``seq``, cached) the cached blocks that follow them, up to
        ``num_blocks``; a hash hit counts only if the block's tokens are equal too."""
        index = len(hits)
        hashes = seq.block_hashes
        cached = self._cached
        block_tokens = self._block_tokens
        tokens = seq.token_ids
        block_size = self.block_size
        num_known = min(len(hashes), num_blocks)
        while index < num_known:  # hashed before (or by a router): its tokens are read only for a hash hit
            block_id = cached.get(hashes[index])
            if block_id is None:
                return
            start = index * block_size
            if block_tokens[block_id] != token_bytes(tokens[start:start + block_size]):
                return
            hits.append(block_id)
            index += 1
        if index >= num_blocks:
            return
        if index > len(hashes):
            self._block_hash(seq, index - 1)  # the chain up to this block
        # The blocks left, hashed here as the walk reaches them: their token bytes converted at once and sliced per
        # block (a slice and a conversion per block were much of an admission's prefix match). The walk stops at the
        # first miss, whose hash is then known: a prompt asked again (it did not fit) stops in the loop above.
        data = token_bytes(tokens[index * block_size : num_blocks * block_size])
        width = block_size * 4
        parent = hashes[index - 1] if index else ROOT_HASH
        for offset in range(0, (num_blocks - index) * width, width):
            block_bytes = data[offset : offset + width]
            parent = hash_block(parent, block_bytes)
            hashes.append(parent)
            block_id = cached.get(parent)
            if block_id is None or block_tokens[block_id] != block_bytes:
                return
            hits.append(block_id)

    def num_cached_prefix_blocks(self, block_hashes: list[int]) -> int:
        """How many leading blocks of these hashes are cached here: a side-effect-free probe for routers (run per
        replica per request: most replicas of a fleet lack the first block, answered before the loop)."""
        cached = self._cached
        if not block_hashes or block_hashes[0] not in cached:
            return 0
        count = 0
        for block_hash in block_hashes:
            if block_hash not in cached:
                break
            count += 1
        return count

    def _register_full_blocks(self, seq: Sequence, num_full_blocks: int) -> None:
        start = seq.num_registered_blocks
        hashes = seq.block_hashes
        if num_full_blocks > start:
            if len(hashes) < start:
                self._block_hash(seq, start - 1)  # the chain up to the first block registered here
            cached = self._cached
            table = seq.block_table
            block_size = self.block_size
            # The blocks' token bytes converted at once and sliced per block: a long prompt in small blocks
            # registers hundreds at admission.
            data = token_bytes(seq.token_ids[start * block_size : num_full_blocks * block_size])
            width = block_size * 4
            block_hashes, block_tokens = self.block_hashes, self._block_tokens
            num_known = len(hashes)
            parent = hashes[start - 1] if start else ROOT_HASH
            offset = 0
            for index in range(start, num_full_blocks):
                block_bytes = data[offset : offset + width]
                offset += width
                if index < num_known:
                    block_hash = hashes[index]
                else:
                    block_hash = hash_block(parent, block_bytes)
                    hashes.append(block_hash)
                parent = block_hash
                if block_hash not in cached:  # else another block already holds this content
                    block_id = table[index]
                    cached[block_hash] = block_id
                    block_hashes[block_id] = block_hash
                    block_tokens[block_id] = block_bytes
        seq.num_registered_blocks = num_full_blocks

    # ---- allocation -----------------------------------------------------------------------------
    def _take_free_block(self) -> int:
        """One block, never-used first, else the head of the free queue, its cached content evicted (_take_free_blocks
        inlines the second case: change both together)."""
        self.num_used_blocks += 1
        self.num_free_blocks -= 1
        if self._num_ever_used < self.num_blocks:
            block_id = self._num_ever_used
            self._num_ever_used += 1
            self.ref_counts.append(1)
            self.block_hashes.append(None)
            self._block_tokens.append(None)
            return block_id
        block_id, _ = self._free.popitem(last=False)
        block_hash = self.block_hashes[block_id]
        if block_hash is not None:  # evict its cached content
            self._num_uncached += 1
            del self._cached[block_hash]
            self.block_hashes[block_id] = None
            self._block_tokens[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id

    def _take_free_blocks(self, num_blocks: int) -> list[int]:
        """``num_blocks`` blocks in the order ``_take_free_block`` hands them out (the never-used ones at once)."""
        self.num_used_blocks += num_blocks
        self.num_free_blocks -= num_blocks
        num_fresh = min(num_blocks, self.num_blocks - self._num_ever_used)
        if num_fresh > 0:
            first = self._num_ever_used
            self._num_ever_used += num_fresh
            self.ref_counts.extend([1] * num_fresh)
            self.block_hashes.extend([None] * num_fresh)
            self._block_tokens.extend([None] * num_fresh)
            taken = list(range(first, first + num_fresh))
            if num_blocks == num_fresh:
                return taken
        else:
            taken = []
        # _take_free_block's second half, inlined: a full cache hands every block of a prompt out this way, each
        # evicting its cached content (a call per block was most of an admission's allocation).
        popitem = self._free.popitem
        ref_counts, block_hashes, block_tokens, cached = (self.ref_counts, self.block_hashes, self._block_tokens,
                                                          self._cached)
        num_uncached = self._num_uncached
        for _ in range(num_blocks - len(taken)):
            block_id = popitem(False)[0]
            block_hash = block_hashes[block_id]
            if block_hash is not None:  # evict its cached content
                num_uncached += 1
                del cached[block_hash]
                block_hashes[block_id] = None
                block_tokens[block_id] = None
            ref_counts[block_id] = 1
            taken.append(block_id)
        self._num_uncached = num_uncached
        return taken

    def allocate(self, seq: Sequence, cached_blocks: list[int], num_new_tokens: int) -> bool:
        """Admit ``seq``: share ``cached_blocks`` (from find_cached_prefix) and add room for ``num_new_tokens``."""
        block_size = self.block_size
        num_cached_tokens = len(cached_blocks) * block_size
        num_tokens_after = num_cached_tokens + num_new_tokens
        num_new_blocks = -(-num_tokens_after // block_size) - len(cached_blocks)
        num_free_blocks = self.num_free_blocks
        if cached_blocks:
            ref_counts = self.ref_counts
            # One C pass, not a generator: this runs every step that a long waiting head does not fit.
            num_revived = list(map(ref_counts.__getitem__, cached_blocks)).count(0)
            if num_new_blocks + num_revived > num_free_blocks:
                self._remember_prefix(seq, cached_blocks)
                return False
            self.num_used_blocks += num_revived
            self.num_free_blocks -= num_revived
            for block_id in cached_blocks:
                if ref_counts[block_id] == 0:
                    del self._free[block_id]
                ref_counts[block_id] += 1
            table = list(cached_blocks)
            table.extend(self._take_free_blocks(num_new_blocks))
        else:  # (a new list: the caller may keep the one it passed)
            if num_new_blocks > num_free_blocks:
                return False
            table = self._take_free_blocks(num_new_blocks)
        seq.block_table = table
        seq.num_computed_tokens = num_cached_tokens
        seq.num_registered_blocks = len(cached_blocks)
        if self.enable_prefix_caching:
            self.num_queried_tokens += len(seq.token_ids)
            self.num_hit_tokens += num_cached_tokens
            self._register_full_blocks(seq, num_tokens_after // block_size)
        return True

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """The blocks ``append_slots(seq, num_new_tokens)`` takes (0 if its table has room)."""
        return max(-(-(seq.num_computed_tokens + num_new_tokens) // self.block_size) - len(seq.block_table), 0)

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` more tokens of a running sequence."""
        num_tokens_after = seq.num_computed_tokens + num_new_tokens
        table = seq.block_table
        # num_new_blocks, inlined: this runs for every block event of every step
        num_new_blocks = -(-num_tokens_after // self.block_size) - len(table)
        if num_new_blocks > 0:
            if num_new_blocks > self.num_free_blocks:
                return False
            if num_new_blocks == 1:  # a decode token opening a block: the common case
                table.append(self._take_free_block())
            else:
                table.extend(self._take_free_blocks(num_new_blocks))
        if self.enable_prefix_caching and num_tokens_after // self.block_size > seq.num_registered_blocks:
            self._register_full_blocks(seq, num_tokens_after // self.block_size)
        return True

    def forget_uncomputed(self, seq: Sequence) -> list[int]:
        """Withdraw from the prefix cache the blocks this sequence registered for tokens it has not computed
        (its step failed): their hashes promise KV contents that were never written. Returns the blocks withdrawn
        (another sequence admitted in that step may have counted them as computed prefix hits)."""
        computed_blocks = seq.num_computed_tokens // self.block_size
        withdrawn = []
        for index in range(computed_blocks, seq.num_registered_blocks):
            block_id = seq.block_table[index]
            block_hash = self.block_hashes[block_id]
            if block_hash is not None and self._cached.get(block_hash) == block_id:
                self._num_uncached += 1
                del self._cached[block_hash]
                self.block_hashes[block_id] = None
                self._block_tokens[block_id] = None
                withdrawn.append(block_id)
        seq.num_registered_blocks = min(seq.num_registered_blocks, computed_blocks)
        return withdrawn

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; the tail is freed first so it is evicted before the shared head."""
        ref_counts = self.ref_counts
        free = self._free
        block_hashes = self.block_hashes
        num_released = 0
        for block_id in reversed(seq.block_table):
            count = ref_counts[block_id] - 1
            ref_counts[block_id] = count
            if not count:
                num_released += 1
                free[block_id] = None
                if block_hashes[block_id] is None:
                    free.move_to_end(block_id, last=False)  # holds nothing reusable: hand it out first
        self.num_used_blocks -= num_released
        self.num_free_blocks += num_released
        seq.block_table = []
        seq.num_registered_blocks = 0
