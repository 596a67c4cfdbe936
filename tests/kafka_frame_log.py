"""``FrameLog``: an incident processor for the Kafka incident stage's tests, which records each frame
the stage runs and makes one incident of it, so a test can see which frames ran, when, and whether
their incidents were published once."""

from __future__ import annotations

from typing import Any

from foreshock.findings import Finding, Incident


class FrameLog:
    """Records the (now, number of findings) of each frame the incident stage runs, and makes one
    incident per frame: its id the frame's time where ``id_by_time`` (each frame has its own time),
    else its count (``i1``, ``i2``, ...)."""

    name = "frame_log"

    def __init__(self, id_by_time: bool = False) -> None:
        self.id_by_time = id_by_time
        self.seen: list[tuple[float, int]] = []

    def observe(self, findings: Any, now: float) -> list[Finding]:
        self.seen.append((now, len(findings)))
        incident_id = f"frame@{now:g}" if self.id_by_time else f"i{len(self.seen)}"
        return [Incident(now, incident_id, "open", "rack", "rack0", f"{len(findings)} findings")]

    def state_dict(self) -> dict[str, Any]:
        return {"seen": list(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = [(float(now), int(n)) for now, n in state["seen"]]
