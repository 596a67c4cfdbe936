"""The ``board_id`` a GPU's UUID is carried as, computed here from its definition (not by the
code under test): the low 52 bits of the UUID's 8-byte BLAKE2b digest, read little-endian."""

from __future__ import annotations

import hashlib


def uuid_number(uuid: str) -> int:
    return int.from_bytes(hashlib.blake2b(uuid.encode(), digest_size=8).digest(), "little") & (2**52 - 1)
