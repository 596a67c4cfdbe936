"""foreshock.simulator — a physics-based GPU training cluster with faults and ground truth.

Stable API (the embedded pipeline, ``foreshock demo`` and the detectors' tests rely on it)::

    from foreshock.simulator import ClusterSimulator, build_topology, load_scenario, list_scenarios

    sim = ClusterSimulator(gpus=256, scenario="cooling-loss", seed=1, interval=1.0,
                           duration=1800, random_faults=False)
    sim.topology                 # foreshock.topology.Topology (written as topology.yaml)
    frames = sim.step()          # advance one interval -> [Frame] one per kind:
                                 #   gpu, link, optic, node, rack, job (ts = sim.now)
    for frame in sim.iter_frames(600):   # or iterate: frames per kind per tick, for 600 s
        ...                              # (iter_frames(math.inf) runs until you stop)
    for tick in sim.iter_ticks(600): ... # the same, one list of frames per tick
    sim.events                   # ground truth so far: list[foreshock.events.Event]
    sim.faults                   # list[Fault]: id, type, target_name, onset (s), duration, params
    sim.gpu_uuids                # per GPU slot, the UUID of the board in it now (gpu frames carry
                                 #   it as board_id; a gpu_replacement puts another board there)
    sim.record("out/rec", duration=1800, progress=lambda done, total: ...)  # -> RunSummary

Parameters of ``ClusterSimulator``: ``topology`` (else generated for ``gpus`` GPUs with
``topology_options`` passed to :func:`build_topology`), ``scenario`` (packaged name, YAML
path or :class:`Scenario`; default healthy), ``seed`` (same seed, same run: frames and events),
``interval`` (sampling, 1 s default; 30 s like dcgm-exporter; the random faults are drawn on a
10-s clock of their own, so a seed faults the same cluster at any interval), ``duration`` (the run length
``%`` onsets refer to; default from the scenario), ``random_faults`` (FACTS rates ×``fault_acceleration``,
25 by default, see faults.py), ``params`` (:class:`SimParams` or a dict of overrides, e.g. ``{"missing_prob": 0}``),
``physics_dt`` (internal step, default 1 s, at most the interval), ``start_time`` (epoch s),
``start_hour`` (the UTC hour of the day the facility water's diurnal swing starts at; default
``start_time``'s own — a live run that stamps frames with the wall clock passes one, so that the
same seed gives the same run at any hour), ``probes`` (attribute: callables given the simulator
after every physics step past the warm-up, to read hidden state).

Ground truth (``sim.events``; ``events.jsonl`` in recordings, sorted by time there; live, end
events arrive one debounce window late with the time the condition actually cleared):

- ``fault_onset`` — entity_kind ``loop`` (cooling loop name, e.g. ``cdu0``; detail lists its
  racks), ``gpu``, ``node`` or ``optic`` (detail names its link); ``fault_type`` and
  ``detail.cause`` hold the hidden cause, ``detail.params`` its severity.
- consequences, each with the ``fault_id``/``fault_type`` that caused it (empty when none, e.g.
  the power cap under full load): ``thermal_throttle_start/_end``, ``power_cap_start/_end``,
  ``power_brake_start/_end`` (gpu; ``detail.reasons`` = throttle bits at start, OR over the
  episode at end), ``hbm_overheat_start/_end`` (gpu; HBM within 0.5 °C of its 95 °C limit),
  ``xid`` (gpu; ``detail.code`` 48 or 79; ``detail.reason == "thermal shutdown"`` when a die
  reached 92 °C and powered off),
  ``link_down``/``link_up`` (link; every flap), ``congestion_start/_end`` (link, the links that
  took rerouted traffic), ``job_slowdown_start/_end`` (job; step time > 1.10x nominal, or
  ``detail.reason == "interrupted"`` while a crashed job waits for repair; a job stopped while
  its episode is already open gets a second start with ``detail.continues`` true, naming the
  fault that stopped it).
- ``gpu_replaced`` (gpu) — a board swapped in the slot (a ``gpu_replacement``, or an XID 79
  repair with ``params.xid79_new_board``), at the GPU's scheduled return (the fault's onset plus
  duration, whatever the physics step): ``detail`` has ``old_uuid``,
  ``new_uuid``, ``old_board_id``/``new_board_id`` (the numbers gpu frames carry),
  ``board_number`` (1 for the slot's second board), ``r_core_ratio``/``r_hbm_ratio`` (new
  board's thermal resistance over the old one's) and ``faults_cured`` (the old board's faults
  the swap ended, those the schedule has on at its time: begun before it, not ended; one begun
  at the swap's time is the new board's; their ``duration_s`` in the recording's fault list ends
  at the swap).
- the schedule, without a fault: ``job_end`` (job; ``detail.reason == "completed"``: its GPUs
  go idle) and ``job_start`` (the next job starts on its nodes), as ``params.job_churn`` ends and
  starts jobs.
- debouncing: an episode ends only after its condition stayed clear for ``HOLD_S`` seconds
  (30-60 s), so the power cap that releases during each communication phase is one episode;
  one still inside that hold when the run ends is ended where its condition cleared (one still
  on stays open).
- ``recording.json`` has the ``duration`` asked for; a run stopped early (Ctrl-C, an error)
  writes ``"complete": false`` there, and readers warn (``Recording.interrupted``).

Conventions detectors can rely on: gpu ``board_id`` is the board's UUID as a number
(``foreshock.boards.board_id``; NaN only in a failed read; a GPU off the bus keeps it),
link counters are cumulative (``params.counter_bits=32``
makes them wrap), one ``xmit_wait`` tick = 64 bytes at the port rate
(``facts.XMIT_WAIT_TICK_BYTES``), optic slot = 2·link + end (end a = the GPU NIC side),
rack ``coolant_temp`` is the loop's CDU supply and ``inlet_temp`` the rack's inlet, node
``fan_speed`` is the node's slowest fan (a dead fan reads 0).

Real formats: ``foreshock.simulator.formats.dcgm_exposition(gpu_frame, topology)`` renders a
dcgm-exporter scrape, ``nvidia_smi_csv(gpu_frame, topology, node)`` an ``nvidia-smi
--query-gpu`` CSV, ``infiniband_sysfs(link_frame, topology, node, root)`` a node's
``/sys/class/infiniband`` port counters, so the real importers can be driven by the simulator
(``foreshock simulate --via`` / ``demo --via`` do this with ``foreshock.streams.via_format``).
"""

from __future__ import annotations

from .engine import DEFAULT_START, HOLD_S, MAX_INTERVAL_S, ClusterSimulator, RunSummary
from .faults import FAULT_TYPES, RANDOM_FAULT_ACCELERATION, Fault
from .params import SimParams
from .scenario import Scenario, ScenarioError, list_scenarios, load_scenario
from .topology_gen import build_topology

__all__ = [
    "ClusterSimulator", "RunSummary", "SimParams", "Scenario", "ScenarioError", "Fault", "FAULT_TYPES",
    "RANDOM_FAULT_ACCELERATION", "DEFAULT_START", "HOLD_S", "MAX_INTERVAL_S",
    "build_topology", "list_scenarios", "load_scenario",
]
