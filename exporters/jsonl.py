"""JSON-lines finding sink: one finding per line, as ``findings.py`` serialises it."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Iterable

from foreshock.findings import Finding, finding_to_json
from foreshock.frames import Frame


class JsonlSink:
    """Writes findings to ``path`` (emptied first), each line as it comes.

    For runs of weeks: the file is opened for appending, so that after logrotate's copytruncate
    the lines go on from the start of the emptied file (written at the old offset, they followed
    a hole of NUL bytes as long as the rotated part); and it is line-buffered, so that a reader
    following it (tail -f, a log shipper) sees a finding when it is found, not 8 KB later."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        open(self.path, "w", encoding="utf-8").close()  # a new run's file starts empty
        self._fh: IO[str] = open(self.path, "a", encoding="utf-8", buffering=1)
        self.written = 0

    def observe_frame(self, frame: Frame, received_wall: float | None = None) -> None:
        pass

    def observe_findings(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            self._fh.write(finding_to_json(f) + "\n")
            self.written += 1

    def close(self) -> None:
        self._fh.close()
