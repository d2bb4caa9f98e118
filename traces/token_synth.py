"""Deterministic synthetic prompt token ids, so traces without text can drive a real engine.

Two ways to make ids, both pure functions (no RNG state), vectorised with numpy uint64:

* from hash ids: token `i` of the block named `h` depends only on `(h, i)`. Equal hash
  ids therefore give equal token blocks in every request (prefix caching sees the reuse
  the trace describes) and different ids give unrelated blocks;
* from `(seed, row)`: a request's tokens depend only on its row, so requests share no
  prefix (beyond what a collision of the first token in a small vocabulary allows).

Each token is `key ^ position_key[i]` (both splitmix64 outputs) scrambled by one multiply
and mapped into `[0, vocab_size)` with a multiply-shift instead of a modulo: about 0.4 s
for the whole Mooncake trace (145M tokens) on two CPU cores. Turning the arrays into
Python lists costs several times more than making them (about 2 s for that trace), so
callers that can take a numpy array should use `Trace.prompt_token_array`.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL_1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL_2 = np.uint64(0x94D049BB133111EB)
_HASH_DOMAIN = np.uint64(0x68617368_5F696473)  # keeps hash-id keys apart from row keys
_ROW_DOMAIN = np.uint64(0x726F775F_69647321)
_POSITION_DOMAIN = np.uint64(0x706F7369_74696F6E)
_MAX_VOCAB = 1 << 32


def mix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array: a bijection that scrambles all bits."""
    z = values + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MUL_1
    z = (z ^ (z >> np.uint64(27))) * _MUL_2
    return z ^ (z >> np.uint64(31))


_MASK64 = (1 << 64) - 1
# Up to this many hash ids are mixed one by one as Python ints (the same bits as mix64), more as an array: for a
# prompt of a few blocks numpy's nine calls on a small uint64 array cost 5-6 us more; from about 16 ids on (the
# Mooncake trace's long prompts) the array is as fast.
_MAX_SCALAR_KEYS = 16


def mix64_int(value: int) -> int:
    """``mix64`` of one value as a Python int: the same bits without a numpy call per operation (a request's
    key is one number, and numpy's per-call overhead on one-element arrays cost more than its tokens)."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _position_keys(length: int) -> np.ndarray:
    """The first ``length`` position keys: a view of a cached power-of-two run (prompt lengths all differ, so
    caching by length missed nearly every time and recomputed the keys per request)."""
    return _position_keys_upto(max(1, 1 << (length - 1).bit_length()))[:length]


@lru_cache(maxsize=8)
def _position_keys_upto(capacity: int) -> np.ndarray:
    keys = mix64(np.arange(capacity, dtype=np.uint64) ^ _POSITION_DOMAIN)
    keys.setflags(write=False)
    return keys


@lru_cache(maxsize=8)
def _tiled_position_keys_upto(width: int, num_blocks: int) -> np.ndarray:
    """The first ``width`` position keys repeated ``num_blocks`` times, one flat array (see ``_position_keys``)."""
    keys = np.tile(_position_keys(width), num_blocks)
    keys.setflags(write=False)
    return keys


def _to_vocab(keys: np.ndarray, positions: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids in [0, vocab_size) from (block key, position key) pairs, broadcast."""
    return _scrambled_into_vocab(np.bitwise_xor(keys, positions), vocab_size)


def _scrambled_into_vocab(z: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids in [0, vocab_size) from xors ``z`` of block and position keys (uint64, overwritten).

    Both keys are already scrambled, so their xor is uniform; one odd multiply decorrelates
    blocks whose keys differ by a constant, and the top 32 bits are scaled into the
    vocabulary (multiply-shift, no slow modulo). Done in place on one buffer: memory
    traffic, not arithmetic, is the cost.
    """
    z *= _MUL_1_ARRAY
    z >>= _32_ARRAY
    z *= _vocab_array(vocab_size)
    z >>= _32_ARRAY
    return z.view(np.int64)


# _scrambled_into_vocab's operands as 0-d uint64 arrays (the same bits): a numpy scalar operand costs each in-place
# operation some 1,800 instructions more, and a uint64 scalar made per call 3,000 (a fifth of the cost of a
# simulated Azure request's 1,500 tokens).
_MUL_1_ARRAY = np.array(_MUL_1)
_32_ARRAY = np.array(32, dtype=np.uint64)


@lru_cache(maxsize=8)
def _vocab_array(vocab_size: int) -> np.ndarray:
    return np.array(vocab_size, dtype=np.uint64)


def _check_vocab(vocab_size: int) -> None:
    if not 1 <= vocab_size < _MAX_VOCAB:
        raise ValueError(f"vocab_size is {vocab_size}; expected 1 <= vocab_size < 2**32")


def tokens_from_hash_ids_array(
    hash_ids: np.ndarray, num_tokens: int, block_size: int, vocab_size: int
) -> np.ndarray:
    """The first `num_tokens` of the concatenated blocks named by `hash_ids` (int64 array)."""
    _check_vocab(vocab_size)
    # Only the blocks and positions the prompt reaches: a trace may declare blocks far longer than its prompts
    # (hash_block_size up to 2**31), and the whole first block was 16 GiB of keys.
    hash_ids = np.asarray(hash_ids, dtype=np.int64)[: -(-num_tokens // block_size) if num_tokens > 0 else 0]
    if len(hash_ids) <= _MAX_SCALAR_KEYS:  # a prompt's few blocks: numpy's per-call cost exceeds the arithmetic
        domain = int(_HASH_DOMAIN)
        keys = np.array([mix64_int((h & _MASK64) ^ domain) for h in hash_ids.tolist()], dtype=np.uint64)
    else:
        keys = hash_id_keys(hash_ids)
    return tokens_from_block_keys(keys, num_tokens, block_size, vocab_size)


def hash_id_keys(hash_ids: np.ndarray) -> np.ndarray:
    """The block keys of hash ids (an int64 array), as ``tokens_from_block_keys`` takes them: a trace's keys can be
    made once for all its rows (traces.requests), the tokens of each row from a slice of them."""
    return mix64(np.asarray(hash_ids, dtype=np.int64).view(np.uint64) ^ _HASH_DOMAIN)


def tokens_from_block_keys(keys: np.ndarray, num_tokens: int, block_size: int, vocab_size: int) -> np.ndarray:
    """The first ``num_tokens`` tokens (int64 values in [0, vocab_size), the vocabulary checked by the caller) of the
    blocks whose uint64 keys (``hash_id_keys``) are ``keys``; keys past the prompt's last block are not read."""
    width = min(block_size, max(num_tokens, 0))
    keys = keys[: -(-num_tokens // block_size) if num_tokens > 0 else 0]
    if width == 0 or not len(keys):
        return np.empty(0, dtype=np.int64)
    # Each block's key repeated over its positions and xored with the position keys tiled, as flat arrays: the same
    # values as broadcasting keys[:, None] against the positions[None, :], whose xor ran numpy's inner loop once per
    # block on block_size (16) tokens (a third of a simulated request's prompt synthesis; flat: -15 % of it).
    z = np.repeat(keys, width)
    num_blocks = len(keys)
    z ^= _tiled_position_keys_upto(width, max(1, 1 << (num_blocks - 1).bit_length()))[:len(z)]
    return _scrambled_into_vocab(z, vocab_size)[:num_tokens]


def tokens_from_rows_into(out: np.ndarray, first_row: int, num_tokens: list[int], seed: int,
                          vocab_size: int) -> np.ndarray:
    """The prompts of rows ``first_row``, ``first_row + 1``, ... (``num_tokens[k]`` tokens for row ``first_row + k``)
    concatenated, each exactly as ``tokens_from_row_array`` makes it, made in ``out`` (uint64, at least their total
    long): one numpy call per row and a few for them all, where each row alone took a dozen (their per-call cost was
    most of a simulated Azure request's synthesis), and no array allocated per call (the simulator maps large
    blocks on their own: fresh pages, faulted in, for every temporary). Returns their int64 view in ``out``."""
    _check_vocab(vocab_size)
    z = out[:sum(num_tokens)]
    keys = mix64(np.arange(first_row, first_row + len(num_tokens), dtype=np.uint64) + np.uint64(_seed_key(seed)))
    positions = _position_keys(max(num_tokens, default=0))
    xor = np.bitwise_xor
    start = 0
    for index, length in enumerate(num_tokens):
        end = start + length
        # The key as a 0-d array (a numpy scalar costs more) and ``out`` positional: numpy's fast path, ~4,000
        # instructions less a row than a 1-element slice and a keyword.
        xor(positions[:length], keys[index, ...], z[start:end])
        start = end
    return _scrambled_into_vocab(z, vocab_size)


def tokens_from_blocks_into(out: np.ndarray, keys: np.ndarray, block_size: int, vocab_size: int) -> np.ndarray:
    """Every token of the blocks whose keys (``hash_id_keys``) are ``keys``, whole, made in ``out`` (uint64, at least
    ``len(keys) * block_size`` long): ``tokens_from_block_keys`` of them all, without its temporaries. Returns their
    int64 view in ``out``."""
    z = out[:len(keys) * block_size]
    np.bitwise_xor(keys[:, None], _position_keys(block_size), out=z.reshape(len(keys), block_size))
    return _scrambled_into_vocab(z, vocab_size)


def tokens_from_row_array(row: int, num_tokens: int, seed: int, vocab_size: int) -> np.ndarray:
    """`num_tokens` ids that depend only on (seed, row): distinct requests share no prefix."""
    _check_vocab(vocab_size)
    key = mix64_int((_seed_key(seed) + (row & _MASK64)) & _MASK64)
    # The key as a 0-d array, not a numpy scalar: the xor with a scalar operand cost 1,600 instructions more.
    return _to_vocab(np.array(key, dtype=np.uint64), _position_keys(num_tokens), vocab_size)


@lru_cache(maxsize=8)
def _seed_key(seed: int) -> int:
    """The rows' common key part: one per run (mixed afresh for every request, it was a tenth of its tokens' cost)."""
    return mix64_int((seed & _MASK64) ^ int(_ROW_DOMAIN))
