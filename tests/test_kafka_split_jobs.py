"""Kafka routing keeps a rack's entities in one partition; a training job spans racks, so each
detect worker's straggler detector compares a job's GPUs within its partition's share of the job
only (a helper's audit, 2026-12-05: a node whose 8 GPUs all ran 15 % slow, alone with its share of
the job in its partition, went unflagged there where the embedded pipeline flags it). Not mended;
the worker says so once, naming the jobs split, and the README states it."""

from __future__ import annotations

import logging

import pytest

from foreshock.detectors.bank import DetectorBank
from foreshock.streams.kafka_codec import PartitionMap
from foreshock.streams.kafka_worker import DetectionStage
from foreshock.topology import Topology

TOPOLOGY = Topology.from_dict({
    "cluster": "c", "rows": [{"name": "row0", "cooling_loop": "cdu0"}],
    "racks": [{"name": f"r{i}", "row": "row0"} for i in range(4)],
    "nodes": [{"name": f"gpu{i:03d}", "rack": f"r{i}", "gpus": 8} for i in range(4)],
    "jobs": [{"name": "4711:llama", "nodes": [f"gpu{i:03d}" for i in range(4)]},
             {"name": "12:small", "nodes": []}]})


def test_the_jobs_split_across_partitions_are_found() -> None:
    assert PartitionMap(TOPOLOGY, 1).split_jobs() == []
    assert PartitionMap(TOPOLOGY, 2).split_jobs() == [(0, 2)]
    assert PartitionMap(TOPOLOGY, 4).split_jobs() == [(0, 4)]


@pytest.mark.parametrize("partitions, detectors, warned", [(4, ["straggler"], True), (1, ["straggler"], False),
                                                            (4, ["thermal"], False)])
def test_a_worker_says_once_that_a_jobs_peers_are_compared_per_partition(
        caplog: pytest.LogCaptureFixture, partitions: int, detectors: list[str], warned: bool) -> None:
    with caplog.at_level(logging.WARNING, logger="foreshock.worker"):
        DetectionStage(TOPOLOGY, lambda hardware: DetectorBank.from_names(hardware, detectors), partitions)
    said = [r.getMessage() for r in caplog.records if "partitions" in r.getMessage()]
    assert said == ([f"1 of 2 jobs span several of the 4 partitions (4711:llama over 4): the straggler detector "
                     "compares each job's GPUs within one partition's share of it, not across the job"]
                    if warned else [])
