"""Findings-topic messages the incident stage must refuse, not run: a piece report of frame -1
(its sender never taken up) raised KeyError in ``IncidentStage.observe``, and a finding with
``"ts": null`` or ``"ts": "x"`` raised in the incident processors; either ended the worker, and
its restart met the same record, for good. A report of frame 0, or of part 5 of 2, was taken and
counted nowhere. Each is refused as ``undecodable``: counted and dead-lettered.

No broker: the worker's topics and streams are ``test_kafka_poison_records``' stand-ins.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from foreshock.detectors.bank import DetectorBank
from foreshock.findings import Anomaly, Prediction
from foreshock.health import PipelineHealth
from foreshock.streams.kafka_codec import FindingsMessage, PieceInfo, PieceReport, RecordError, decode_findings, \
    encode_findings
from foreshock.streams.kafka_worker import IncidentStage
from foreshock.topology import Topology

import test_kafka_poison_records as support

# a sender that started after any stage of the test: counted from frame 1, never taken up (a day
# ahead of the import: a minute ahead, a full run reaching these tests later read it as started
# before the stage, taken up, and the test failed by the clock)
SENDER = f"ext#{time.time_ns() // 1_000_000 + 86_400_000}"
ANOMALY = {"type": "anomaly", "ts": 100.0, "entity_kind": "gpu", "slot": 3, "field": "gpu_temp", "score": 9.0,
           "detector": "robust_zscore", "reason": ""}


def _message(seq: int = 1, part: int = 0, parts: int = 1, findings: list[dict[str, Any]] | None = None,
             **report: Any) -> bytes:
    """A findings message of one piece report, as ``encode_findings`` writes it, with the fields given."""
    piece = {"agent": SENDER, "seq": seq, "part": part, "parts": parts, "now": 100.0, "rows": 1,
             "findings": findings or [], **report}
    return json.dumps({"agent": SENDER, "sent": 0.0, "partition": 0, "offset": 0, "worker": "w",
                       "pieces": [piece]}).encode()


IDENTITIES = {
    "seq -1": _message(seq=-1),
    "seq 0": _message(seq=0),  # frames count from 1 (the frames topic's bad_headers)
    "part 5 of 2": _message(part=5, parts=2),
    "part -1 of 1": _message(part=-1),
    "parts 0": _message(parts=0),
    "rows -1": _message(rows=-1),
    "agent a number": _message(agent=7),
    "now a string": _message(now="100"),
}
FINDINGS = {
    "ts null": {"ts": None},
    "ts a string": {"ts": "x"},
    "ts NaN": {"ts": float("nan")},
    "score null": {"score": None},
    "slot a string": {"slot": "3"},
    "slot 2.5": {"slot": 2.5},
    "kind a number": {"entity_kind": 1},
    "no slot": {"slot": None},
}


@pytest.mark.parametrize("name", list(IDENTITIES) + list(FINDINGS))
def test_malformed_reports_and_findings_are_undecodable(name: str) -> None:
    value = IDENTITIES[name] if name in IDENTITIES else _message(findings=[{**ANOMALY, **FINDINGS[name]}])
    with pytest.raises(RecordError) as refused:
        decode_findings(value)
    assert refused.value.reason == "undecodable"


def test_the_findings_a_detection_stage_writes_still_decode() -> None:
    """What ``encode_findings`` writes reads back unchanged, NumPy numbers included (written
    through ``default=float``: an int64 slot as 3.0, a bool as 1.0)."""
    anomaly = Anomaly(np.float64(5.0), "gpu", np.int64(3), "gpu_temp", np.float32(2.5), "robust_zscore", "r")
    prediction = Prediction(6.0, "node", 1, "thermal_throttle", float("inf"), 0.5, "thermal", "", np.bool_(False))
    value = encode_findings([PieceReport(PieceInfo("a#1", 4, 1, 2, 0.0), 6.0, 9, [anomaly, prediction])], 0, 7)
    (report,) = decode_findings(value)
    assert (report.agent, report.seq, report.part, report.parts, report.rows, report.now) == ("a#1", 4, 1, 2, 9, 6.0)
    # (the expected findings are written out, not read back through the code under test)
    assert report.findings == [Anomaly(5.0, "gpu", 3, "gpu_temp", 2.5, "robust_zscore", "r"),
                               Prediction(6.0, "node", 1, "thermal_throttle", float("inf"), 0.5, "thermal", "", False)]
    assert isinstance(report.findings[0].slot, int) and report.findings[1].active is False


def test_a_report_below_frame_one_does_not_end_the_incident_stage(small_topology: Topology) -> None:
    """A report that gets past the decoder all the same (built by hand, as a test or a future
    decoder might) is not taken, and the stage goes on: a sender never taken up has no entry in
    ``taken_up``, which ``observe`` indexed."""
    stage = IncidentStage([], PipelineHealth(), small_topology)
    assert stage.observe(FindingsMessage(SENDER, -1, 0, 1, 100.0, 1, 0.0, [])) == []
    assert not stage.pending
    stage.observe(FindingsMessage(SENDER, 1, 0, 1, 100.0, 1, 0.0, []))
    assert stage.released == {SENDER: 1}


def test_the_worker_counts_and_dead_letters_them_and_goes_on(tmp_path: Path, monkeypatch,
                                                             small_topology: Topology) -> None:
    """Through the worker's incident stage, with the incident processors: each such record is
    counted (``incidents/undecodable``, where the findings topic's other problems are) and
    dead-lettered as it came, and a good report after them is still run. Before, the first ended
    the worker (exit 70) and its restart met it again."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    worker, sent, exits = support._worker(small_topology)
    assert worker.incident_stage.processors  # the processors are what a bad finding's ts broke
    stream = support._Stream()

    async def no_external() -> None:  # (its reader needs a broker)
        return None

    worker.poll_external = no_external  # type: ignore[method-assign]
    bad = [IDENTITIES["seq -1"], IDENTITIES["seq 0"], IDENTITIES["part 5 of 2"],
           _message(findings=[{**ANOMALY, "ts": None}]), _message(findings=[{**ANOMALY, "ts": "x"}])]
    good = _message(seq=1, findings=[ANOMALY])

    async def run() -> None:
        for offset, value in enumerate(bad + [good], start=1):
            await worker.handle(worker.on_findings, stream, support._event(support.FINDINGS_TOPIC, offset, value, []))

    asyncio.run(run())
    assert exits == []
    dead = [(v, dict(hd)["foreshock-reason-code"]) for name, v, hd in sent if name == "deadletter_topic"]
    assert dead == [(value, b"undecodable") for value in bad]
    assert worker.health.problems[("incidents", "undecodable")] == len(bad)
    assert worker.health.dead_letters == len(bad)
    # the good report after them ran: its frame 1 released, nothing waiting
    assert worker.incident_stage.released == {SENDER: 1} and not worker.incident_stage.pending
    worker.remove_data_dir()
