"""Pipeline health: every problem with the input is counted by reason and logged once.

Bad input never stops the pipeline and never disappears. Each part that rejects or repairs
input calls :meth:`PipelineHealth.problem`; the exporter publishes the counts as
``foreshock_input_problems_total{stage, reason}``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

log = logging.getLogger("foreshock")


class PipelineHealth:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.problems: Counter[tuple[str, str]] = Counter()
        self.samples: Counter[str] = Counter()  # samples processed, by entity kind
        self.findings: Counter[str] = Counter()  # findings emitted, by type
        self.dead_letters = 0
        # polls a live source skipped, by stage: a poll (or the consumer of its frames) took
        # longer than the interval. Not an input problem: the input was fine, there is less of it
        self.polls_skipped: Counter[str] = Counter()
        # times a live source's derived topology took in entities it had not listed (a node
        # replaced or added), by stage: ``foreshock_topology_changes_total``
        self.topology_changes: Counter[str] = Counter()
        # GPUs found with another board in their slot (their UUID changed), by stage: the source
        # that read the UUIDs, the guard stage whose pipeline restarted their state:
        # ``foreshock_gpus_replaced_total``
        self.gpus_replaced: Counter[str] = Counter()
        # GPU boards read at another index of their node than before (a node rebooted with a GPU
        # missing lists every later GPU one index lower), by stage, as ``gpus_replaced``: no RMA,
        # the board's learnt state follows it: ``foreshock_gpus_moved_total``
        self.gpus_moved: Counter[str] = Counter()
        # Kafka records of a partition no longer (or not yet) assigned to this worker, by stage:
        # left to the partition's owner after a rebalance, not processed. Not an input problem:
        # nothing is wrong with them. ``foreshock_records_not_assigned_total``
        self.records_not_assigned: Counter[str] = Counter()
        self._logged: set[tuple[str, str]] = set()

    def problem(self, stage: str, reason: str, count: int = 1, detail: str = "") -> None:
        """Count ``count`` occurrences of a problem; log the first of each (stage, reason)."""
        if count > 0 and self._count(self.problems, (stage, reason), count, (stage, reason)):
            log.warning("%s: %s%s (counted in foreshock_input_problems_total; logged once)",
                        stage, reason, f": {detail}" if detail else "")

    def skipped_polls(self, stage: str, count: int, detail: str = "") -> None:
        """Count ``count`` polls a source skipped; log the first of each stage."""
        if count > 0 and self._count(self.polls_skipped, stage, count, (stage, "polls skipped")):
            log.warning("%s: polls skipped%s (counted in foreshock_polls_skipped_total; logged once)",
                        stage, f": {detail}" if detail else "")

    def topology_changed(self, stage: str) -> None:
        """Count one change of the topology a live source derives (the caller logs what changed)."""
        self._count(self.topology_changes, stage, 1)

    def gpu_replaced(self, stage: str, count: int = 1) -> None:
        """Count GPUs found with another board in their slot (the caller logs which)."""
        self._count(self.gpus_replaced, stage, count)

    def gpu_moved(self, stage: str, count: int = 1) -> None:
        """Count GPU boards found at another index of their node (the caller logs which)."""
        self._count(self.gpus_moved, stage, count)

    def not_assigned(self, stage: str, count: int = 1) -> None:
        """Count records left to their partition's owner (the caller logs the first)."""
        self._count(self.records_not_assigned, stage, count)

    def _count(self, counter: Counter, key: object, count: int, log_key: tuple[str, str] | None = None) -> bool:
        """Add ``count`` to ``counter[key]``; whether ``log_key`` is logged for the first time."""
        with self._lock:
            counter[key] += count
            if log_key is None or log_key in self._logged:
                return False
            self._logged.add(log_key)
            return True

    # copies for exporters reading from another thread
    def skipped(self) -> dict[str, int]:
        """The polls skipped by stage."""
        return self._copy(self.polls_skipped)

    def changes(self) -> dict[str, int]:
        """The topology changes by stage."""
        return self._copy(self.topology_changes)

    def replacements(self) -> dict[str, int]:
        """The GPUs replaced by stage."""
        return self._copy(self.gpus_replaced)

    def moves(self) -> dict[str, int]:
        """The GPU boards moved to another index of their node, by stage."""
        return self._copy(self.gpus_moved)

    def unassigned(self) -> dict[str, int]:
        """The records left to their partition's owner, by stage."""
        return self._copy(self.records_not_assigned)

    def _copy(self, counter: Counter) -> dict:
        with self._lock:
            return dict(counter)

    def processed(self, kind: str, count: int) -> None:
        with self._lock:
            self.samples[kind] += count

    def emitted(self, finding_type: str, count: int = 1) -> None:
        with self._lock:
            self.findings[finding_type] += count

    def total_problems(self) -> int:
        return sum(self.problems.values())

    def counts(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        """A consistent copy of (samples by kind, problems by stage and reason), for exporters
        reading from another thread."""
        with self._lock:
            return dict(self.samples), dict(self.problems)
