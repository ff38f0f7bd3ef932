"""Chained hashes of full KV blocks, identical in every process (router, prefill, decode).

``hash(block i) = H(hash(block i-1), token ids of block i)`` with a keyed BLAKE2b whose key is a
fixed constant: unlike Python's ``hash`` it does not change with PYTHONHASHSEED, so a router can
compute the same hashes as the workers that store the blocks. The root parent depends on the
optional cache salt, which isolates tenants' caches from each other, and on the request's longrope
state. Pure Python (no torch).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from hashlib import blake2b

BlockHash = bytes
_KEY = b"baton-kv-block-v1"
_DIGEST = 16
# Copying a keyed hasher is cheaper than keying a new one (the key costs a compression).
_KEYED = blake2b(key=_KEY, digest_size=_DIGEST)


def root_hash(cache_salt: str | None = None, long_rope: bool = False) -> BlockHash:
    """Parent of the first block; distinct salts give disjoint caches. ``long_rope``: the sequence's
    KV is rotated with longrope's long factors (``Request.long_rope``), which a short-rope sequence's
    blocks must not serve, nor the other way round (its mark, 0xff, is a byte no UTF-8 salt has)."""
    h = _KEYED.copy()
    h.update(b"root")
    if long_rope:
        h.update(b"\xfflong-rope")
    if cache_salt:
        h.update(cache_salt.encode())
    return h.digest()


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    return hash_packed(parent, struct.pack(f"<{len(token_ids)}q", *token_ids))


def block_packer(block_size: int) -> Callable[..., bytes]:
    """``pack(*token_ids)``: a full block's tokens as the bytes ``hash_block`` hashes, with the format
    parsed once (a third of ``hash_block``'s time went to building and parsing it per block)."""
    return struct.Struct(f"<{block_size}q").pack


def hash_packed(parent: BlockHash, packed_token_ids: bytes) -> BlockHash:
    """``hash_block`` of tokens already packed (``block_packer``)."""
    h = _KEYED.copy()
    h.update(parent)
    h.update(packed_token_ids)
    return h.digest()


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str | None = None,
    *,
    start: int = 0,
    parent: BlockHash | None = None,
    long_rope: bool = False,
) -> list[BlockHash]:
    """Hashes of the full blocks of ``token_ids`` from block index ``start`` on.

    ``parent`` must be the hash of block ``start - 1`` (or None when ``start == 0``).
    """
    if parent is None:
        if start != 0:
            raise ValueError("parent hash is required when start > 0")
        parent = root_hash(cache_salt, long_rope)
    out: list[BlockHash] = []
    for i in range(start, len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out
