"""Power-cap onsets after a HW power brake: a braking PSU sets HW slowdown with the brake (0x88),
which is no thermal limiter — the onset is a ``power_brake`` one, not ``thermal_throttled``."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
from rich.console import Console

from foreshock.detectors import evaluation as ev
from foreshock.events import Event
from foreshock.findings import Prediction
from foreshock.frames import Frame
from foreshock.recording import Recording

from thermal_synth import small_topology

MHZ = 1e6
ONSET = 2000.0
# GPU slot: (throttle reasons in its samples over [1900, 2000) s — GPU 7's [1950, 2000) — and before
# them, SM clock then, what the onset at 2000 s is): all at a steady 600 W, told apart by the bits alone
GPUS = {
    0: (0x88, 0x0, 600, "power_brake"),  # a failed PSU's brake: HW slowdown + HW power brake, cool
    1: (0x80, 0x0, 600, "power_brake"),  # the brake bit alone
    2: (0xC8, 0x0, 600, "power_brake"),  # braked and hot: the brake holds the clock at its floor
    3: (0x08, 0x0, 1400, "thermal_throttled"),  # HW slowdown without the brake: a thermal slowdown
    4: (0x48, 0x0, 1400, "thermal_throttled"),  # HW thermal with HW slowdown
    5: (0x20, 0x0, 1600, "thermal_throttled"),  # SW thermal
    6: (0x0, 0x88, 1980, "steady_load"),  # braked long ago (before 1,900 s), unthrottled since
    7: (0x88, 0x1, 600, "job_start"),  # idle until 1,950 s, braked as its work started
}


def telemetry() -> ev.OnsetTelemetry:
    tel = ev.OnsetTelemetry()
    for slot, (recent, earlier, clock, _) in GPUS.items():
        for k, t in enumerate(range(0, 2100, 10)):
            since = 1950 if earlier & 0x1 else 1900  # GPU 7 idle until 50 s before the onset
            bits = recent if since <= t < ONSET else earlier if t < since else 0x4  # capped from the onset
            util = 0.0 if bits & 0x1 else 1.0
            sm = clock if t < ONSET else 1500
            cols = {"util": util, "throttle_reasons": float(bits), "energy": 600.0 * 10.0 * (k + 1),
                    "sm_clock": sm * MHZ}
            tel.add(Frame("gpu", np.array([float(t)]), np.array([slot]), {c: np.array([v]) for c, v in cols.items()}))
    return tel.finish()


def test_a_braked_onset_is_not_a_thermal_one():
    slots = np.array(sorted(GPUS))
    codes = ev.classify_onsets(telemetry(), slots, np.full(len(slots), ONSET))
    assert {int(s): ev.ONSET_CLASSES[c] for s, c in zip(slots, codes)} == {s: g[3] for s, g in GPUS.items()}


def test_braked_onsets_are_reported_in_their_own_class():
    topo = small_topology(nodes=1, gpus=8, racks=1)
    rec = Recording(Path("."), topo, {})
    events = [Event(ONSET, "power_cap_start", "gpu", f"node0/gpu{g}", "", "") for g in GPUS]
    found = [Prediction(1900.0, "gpu", 0, "power_cap", 60.0, 0.9, "power", "", True)]  # GPU 0's: lead 100 s
    m = ev.score_kind(found, events, ev.EVENT_KINDS["power_cap"], rec, 0.0, 2100.0, telemetry())
    on = m["by_onset"]
    assert (on["power_brake"]["episodes"], on["power_brake"]["recall"]) == (3, round(1 / 3, 4))
    assert on["power_brake"]["lead_median_s"] == 100.0
    assert on["power_brake"]["clock_change"] == {"median_mhz": 900.0, "rose": 1.0, "fell": 0.0, "onsets": 3}
    assert (on["thermal_throttled"]["episodes"], on["thermal_throttled"]["recall"]) == (3, 0.0)
    assert (on["steady_load"]["episodes"], on["job_start"]["episodes"], on["load_step"]["episodes"]) == (1, 1, 0)
    # listed with the other classes that precede the thermal one: the report's order is the classes'
    assert list(on)[:3] == ["job_start", "power_brake", "thermal_throttled"]

    # the printed table gives the class a row of its own with its figures
    report = {"detectors": {"foreshock": {"power_cap": m}}}
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(ev.render_table(report))
    row = next(line for line in console.export_text().splitlines() if re.match(r"\s+power_brake\s+\d", line))
    assert row.split()[1] == "3"
