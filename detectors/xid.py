"""New XID errors and uncorrectable ECC errors, per GPU, as findings.

dcgm-exporter's XID field is the *last* XID the driver logged, never reset (FACTS: alerting on
``DCGM_FI_DEV_XID_ERRORS > 0`` latches forever). A new event is therefore a **change** of the
value; the first value seen for a GPU may be latched from long ago and is not reported. XID 79
("fallen off the bus") is what a GPU says last: its other fields stop reporting. Double-bit
ECC errors (``ecc_dbe``, a counter) are reported on every increase.

Findings are :class:`~foreshock.findings.Anomaly` on the GPU: field ``xid_last`` with the code
as score, or ``ecc_dbe`` with the increase as score. They are what the incident engine roots a
lost or failing GPU on — so the XIDs an *application* causes (:data:`APPLICATION_XIDS`: 13, 31, 43,
45, info per FACTS) are not findings: every crashing user job would open a GPU-error incident on a
healthy GPU. They still count in the exporter's ``foreshock_xid_events_total{severity="info"}``.

>>> from foreshock.topology import Topology
>>> from foreshock.frames import Frame
>>> topo = Topology.from_dict({"rows": [{"name": "r"}], "racks": [{"name": "k", "row": "r"}],
...                            "nodes": [{"name": "n", "rack": "k", "gpus": 2}]})
>>> det, found = XidDetector(topo), []
>>> for t, codes in enumerate([[13, 0], [13, 0], [13, 79], [13, 79]]):   # 13 was latched
...     found += det.update(Frame("gpu", [t, t], [0, 1], {"xid_last": codes, "ecc_dbe": [0, 0]}))
>>> [(f.slot, f.field, f.score) for f in found]
[(1, 'xid_last', 79.0)]
"""

from __future__ import annotations

import math
from typing import ClassVar, Mapping

import numpy as np

from foreshock.facts import XID_SEVERITY
from foreshock.findings import Anomaly, Finding
from foreshock.frames import Frame
from foreshock.numba_config import jit
from foreshock.topology import Topology

from .base import Detector

XID_MEANING = {48: "double-bit ECC error", 63: "row remap pending", 64: "row remap failure", 74: "NVLink error",
               79: "GPU fell off the bus", 92: "high single-bit ECC rate", 94: "contained ECC error",
               95: "uncontained ECC error", 119: "GSP timeout", 120: "GSP error"}
KIND_XID, KIND_DBE = 0, 1
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
"""XIDs a user's program causes, not the GPU (NVIDIA's XID catalogue): 13 graphics engine exception
(an illegal instruction or out-of-range access), 31 GPU memory page fault (an illegal address), 43
GPU stopped processing (the application's channel reset), 45 preemptive cleanup (the driver
killing a process after such an error, or on a Ctrl-C). None is in FACTS' list of XIDs worth
knowing (severity info); until 2026-12-01 each rooted a "gpu_error" incident (family lost)."""


@jit
def _xid_events(slot: np.ndarray, xid: np.ndarray, dbe: np.ndarray, last: np.ndarray,
                out: np.ndarray) -> int:
    """Rows where a GPU's last-XID changes to a new code, or its DBE counter grows.

    ``last[:, 0]`` is the last XID seen, ``last[:, 1]`` the last DBE count (NaN: none yet);
    ``out`` rows are (row, kind, value). Returns the number of rows written."""
    n = 0
    for i in range(len(slot)):
        s = slot[i]
        v = xid[i]
        if math.isfinite(v):
            prev = last[s, 0]
            if prev == prev and v != prev and v > 0:
                out[n, 0] = i
                out[n, 1] = 0
                out[n, 2] = v
                n += 1
            last[s, 0] = v
        d = dbe[i]
        if math.isfinite(d):
            prev = last[s, 1]
            if prev == prev and d > prev:
                out[n, 0] = i
                out[n, 1] = 1
                out[n, 2] = d - prev
                n += 1
            last[s, 1] = d  # a lower value is a driver reload: start again from it
    return n


class XidDetector(Detector):
    """New XIDs (changes of the last-XID field) and DBE ECC increments per GPU."""

    slot_kinds: ClassVar[Mapping[str, str]] = {"s_last": "gpu"}
    name: ClassVar[str] = "xid"
    kinds: ClassVar[tuple[str, ...]] = ("gpu",)

    def __init__(self, topology: Topology) -> None:
        super().__init__(topology)
        self.s_last = np.full((topology.size("gpu"), 2), np.nan)

    def update(self, frame: Frame) -> list[Finding]:
        if frame.kind != "gpu" or len(frame) == 0:
            return []
        nan = np.full(len(frame), np.nan)
        xid = frame.columns.get("xid_last", nan)
        dbe = frame.columns.get("ecc_dbe", nan)
        out = np.empty((2 * len(frame), 3))
        n = _xid_events(frame.slot, np.ascontiguousarray(xid, dtype=np.float64),
                        np.ascontiguousarray(dbe, dtype=np.float64), self.s_last, out)
        findings: list[Finding] = []
        for row, kind, value in out[:n]:
            r, g = int(row), int(frame.slot[int(row)])
            name = self.topology.gpus[g]
            if int(kind) == KIND_XID:
                code = int(value)
                if code in APPLICATION_XIDS:
                    continue
                what = XID_MEANING.get(code, "driver error")
                findings.append(Anomaly(float(frame.ts[r]), "gpu", g, "xid_last", float(code), self.name,
                                        f"XID {code} on {name}: {what} ({XID_SEVERITY.get(code, 'info')})"))
            else:
                findings.append(Anomaly(float(frame.ts[r]), "gpu", g, "ecc_dbe", float(value), self.name,
                                        f"{int(value)} new uncorrectable (double-bit) ECC error(s) on {name}"))
        return findings
