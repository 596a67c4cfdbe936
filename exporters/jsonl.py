"""JSON-lines finding sink: one finding per line, as ``findings.py`` serialises it."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Iterable

from foreshock.findings import Finding, finding_to_json
from foreshock.frames import Frame


class JsonlSink:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[str] = open(self.path, "w", encoding="utf-8")
        self.written = 0

    def observe_frame(self, frame: Frame, received_wall: float | None = None) -> None:
        pass

    def observe_findings(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            self._fh.write(finding_to_json(f) + "\n")
            self.written += 1

    def close(self) -> None:
        self._fh.close()
