"""JSON-lines finding sink: one finding per line, as ``findings.py`` serialises it, with the
entity's name beside its slot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Iterable

from foreshock.findings import Finding, Incident, finding_to_dict
from foreshock.frames import Frame
from foreshock.topology import Topology


class JsonlSink:
    """Writes findings to ``path`` (emptied first), each line as it comes.

    For runs of weeks: the file is opened for appending, so that after logrotate's copytruncate
    the lines go on from the start of the emptied file (written at the old offset, they followed
    a hole of NUL bytes as long as the rotated part); and it is line-buffered, so that a reader
    following it (tail -f, a log shipper) sees a finding when it is found, not 8 KB later."""

    def __init__(self, path: str | Path, topology: Topology | None = None) -> None:
        """``topology``: names each finding's entity (``"entity": "node7/gpu3"``) beside its slot,
        which alone meant nothing to a log shipper or a person reading the file, and which a
        ``watch`` that took in new GPUs renumbers (it sets :attr:`topology` to the new one)."""
        self.path = Path(path)
        self.topology = topology
        open(self.path, "w", encoding="utf-8").close()  # a new run's file starts empty
        self._fh: IO[str] = open(self.path, "a", encoding="utf-8", buffering=1)
        self.written = 0

    def observe_frame(self, frame: Frame, received_wall: float | None = None) -> None:
        pass

    def observe_findings(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            line = finding_to_dict(f)
            if self.topology is not None and not isinstance(f, Incident) \
                    and 0 <= f.slot < self.topology.size(f.entity_kind):
                line["entity"] = self.topology.name(f.entity_kind, f.slot)
            self._fh.write(json.dumps(line, separators=(",", ":"), sort_keys=True, default=float) + "\n")
            self.written += 1

    def close(self) -> None:
        self._fh.close()
