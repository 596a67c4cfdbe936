"""GPU boards: the number a board's UUID is carried as, in the ``board_id`` field.

Every GPU source reads each GPU's UUID (a new board in a slot, an RMA, has a new one) and frames
carry it as ``board_id``; the simulator names its boards the same way. Here, not in a stream
module, because the simulator must not import the streams (DESIGN.md's layering).
"""

from __future__ import annotations

import hashlib
import math

BOARD_ID_BITS = 52  # a float64 holds every integer below 2**53 exactly


def board_id(uuid: str) -> float:
    """The ``board_id`` field's value for a GPU board's UUID: the low 52 bits of its 8-byte
    BLAKE2b digest, an integer a float64 holds exactly (frames carry float64 columns only); NaN
    for no UUID (""). The same UUID gives the same number on every host and version; two boards
    share one with odds of about 2**-52."""
    if not uuid:
        return math.nan
    digest = hashlib.blake2b(uuid.encode(), digest_size=8).digest()
    return float(int.from_bytes(digest, "little") & ((1 << BOARD_ID_BITS) - 1))
