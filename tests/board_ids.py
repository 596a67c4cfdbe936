"""For the board tests: the ``board_id`` a GPU's UUID is carried as, computed here from its
definition (not by the code under test): the low 52 bits of the UUID's 8-byte BLAKE2b digest, read
little-endian; and a finding processor that notes the predictions a swap hands it."""

from __future__ import annotations

import hashlib
from typing import Any

from foreshock.findings import Prediction


def uuid_number(uuid: str) -> int:
    return int.from_bytes(hashlib.blake2b(uuid.encode(), digest_size=8).digest(), "little") & (2**52 - 1)


class Seen:
    """A finding processor (as the incident engine) noting the predictions it is handed."""

    name = "seen"

    def __init__(self) -> None:
        self.predictions: list[tuple[int, bool]] = []

    def observe(self, findings: Any, now: float) -> list[Any]:
        self.predictions += [(f.slot, f.active) for f in findings if isinstance(f, Prediction)]
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
