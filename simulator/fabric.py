"""Fabric traffic, congestion and the cumulative port counters of every link.

Traffic: while a job communicates, each member GPU's NIC link carries ``comm_load`` of its
rate; jobs spanning several scalable units send ``cross_su_fraction`` of it over their leaves'
uplinks (spread evenly over the live ones, like ECMP).

Rerouting: when a GPU's NIC link is down, its traffic goes through NVLink to the GPU of the
next live rail on the same node and out of that NIC (as NCCL's PXN does); on that rail it
reaches the node's ring neighbours in the job, so the NIC links of that rail on the node and
on its two neighbours carry it on top of their own (about twice their load). When an uplink is
down, its share moves to the leaf's other uplinks (ECMP). A link whose demand while communicating exceeds its rate
(``rho > 1``) is congested: its port queues fill (``xmit_wait`` grows by the fraction
``1 − 1/rho`` of the communicating time), it receives PFC pauses and ECN marks, CNPs flow back,
and every job whose traffic crosses it stretches its communication by ``rho``.

Counters are real cumulative counters (starting from weeks of uptime), optionally wrapping at
32 bits like the classic IB PortCounters (data counters count 4-byte words, as sysfs does).
"""

from __future__ import annotations

import numpy as np

from foreshock import facts
from foreshock.topology import Topology

from .params import SimParams

# counter fields of the link frame, in the order kept in the counter matrix
LINK_COUNTERS = (
    "tx_data", "rx_data", "xmit_wait", "pfc_pause_duration", "ecn_marked", "cnp_sent", "cnp_handled",
    "symbol_error", "link_downed", "link_error_recovery", "rcv_errors", "xmit_discards",
    "buffer_overrun_errors", "link_integrity_errors",
)
_WORD_BYTES = {"tx_data": 4.0, "rx_data": 4.0}  # sysfs counts data in 4-byte words
_FLOAT_COUNTERS = {"pfc_pause_duration"}  # seconds (from microseconds), not floored


class FabricModel:
    def __init__(self, topo: Topology, params: SimParams, rng: np.random.Generator) -> None:
        self.params = p = params
        self.rng = rng
        n_links = len(topo.links)
        self.n = n_links
        self.rate = np.where(topo.link_gpu >= 0, facts.LINK_RATE_GPU_BPS, facts.LINK_RATE_UPLINK_BPS)
        self.gpu_links = np.flatnonzero(topo.link_gpu >= 0)
        self.up_links = np.flatnonzero((topo.link_gpu < 0) & (topo.link_a_switch >= 0))
        self.gl_gpu = topo.link_gpu[self.gpu_links]
        self.gl_node = topo.gpu_node[self.gl_gpu]
        self.gl_job = topo.gpu_job[self.gl_gpu]
        self.n_nodes = len(topo.nodes)
        n_switches = max(len(topo.switches), 1)
        self.n_switches = n_switches
        self.gl_leaf = topo.link_b_switch[self.gpu_links]
        self.ul_leaf = topo.link_a_switch[self.up_links]
        # GPU links by (node, rail), positions in gpu_links; ring neighbours of each node in its job
        self.rails = int(topo.gpu_index.max()) + 1 if len(topo.gpus) else 1
        self.gl_rail = topo.gpu_index[self.gl_gpu]
        self.node_rail_link = np.full((self.n_nodes, self.rails), -1, dtype=np.int64)
        self.node_rail_link[self.gl_node, self.gl_rail] = np.arange(len(self.gpu_links))
        self.ring_prev = np.arange(self.n_nodes)
        self.ring_next = np.arange(self.n_nodes)
        for nodes in topo.job_nodes:
            if len(nodes) > 1:
                self.ring_next[nodes] = np.roll(nodes, -1)
                self.ring_prev[nodes] = np.roll(nodes, 1)
        # link slot per GPU (-1 when a GPU has no NIC link)
        self.gpu_link = np.full(len(topo.gpus), -1, dtype=np.int64)
        self.gpu_link[self.gl_gpu] = self.gpu_links
        # share of a job's traffic that crosses spines: 0 inside one SU
        n_jobs = len(topo.jobs)
        self.cross = np.zeros(max(n_jobs, 1))
        for j in range(n_jobs):
            leaves = np.unique(self.gl_leaf[self.gl_job == j])
            rails = np.unique(topo.switch_rail[leaves]) if len(leaves) else leaves
            k = len(leaves) / max(len(rails), 1)  # scalable units the job spans
            self.cross[j] = p.cross_su_fraction * (k - 1) / k if k > 1 else 0.0
        # cumulative counters: weeks of uptime already on them
        self.counters = {name: np.zeros(n_links) for name in LINK_COUNTERS}
        uptime = rng.uniform(1e5, 3e6, n_links)
        self.counters["tx_data"][:] = self.rate / 8 * 0.2 * uptime
        self.counters["rx_data"][:] = self.counters["tx_data"] * rng.uniform(0.98, 1.02, n_links)
        self.counters["xmit_wait"][:] = rng.uniform(1e8, 3e9, n_links)
        self.counters["pfc_pause_duration"][:] = rng.uniform(0.0, 50.0, n_links)
        self.counters["ecn_marked"][:] = rng.uniform(0, 1e6, n_links).round()
        self.counters["cnp_sent"][:] = (self.counters["ecn_marked"] * 0.5).round()
        self.counters["cnp_handled"][:] = (self.counters["cnp_sent"] * 0.98).round()
        self.tick_rate = self.rate / 8.0 / facts.XMIT_WAIT_TICK_BYTES  # xmit_wait ticks per second
        # per-step state
        self.rho = np.zeros(n_links)  # demand / rate while communicating
        self.util = np.zeros(n_links)  # average utilisation over the step
        self.congested = np.zeros(n_links, dtype=bool)
        self.reroute_source = np.full(n_links, -1, dtype=np.int64)  # a down link whose traffic it carries
        self.job_comm_slowdown = np.ones(max(n_jobs, 1))

    def step(self, dt: float, job_active: np.ndarray, comm_load: np.ndarray, comm_time_frac: np.ndarray,
             gpu_alive: np.ndarray, link_up: np.ndarray) -> None:
        p = self.params
        gl, j = self.gpu_links, self.gl_job
        on_job = j >= 0
        jj = np.where(on_job, j, 0)
        rate_g = self.rate[gl]
        sending = on_job & job_active[jj] & gpu_alive[self.gl_gpu]
        demand = np.where(sending, comm_load[jj] * rate_g, 0.0)
        ctf = np.where(sending, comm_time_frac[jj], 0.0)
        up_g = link_up[gl]
        # reroute NIC traffic of down links (PXN): through NVLink to the next live rail's NIC,
        # and on that rail to the ring neighbours, whose NICs on that rail carry it too
        self.reroute_source[:] = -1
        moved = np.flatnonzero(~up_g & (demand > 0))
        if len(moved):
            extra = np.zeros(len(gl))
            for k in moved:
                node, rail = int(self.gl_node[k]), int(self.gl_rail[k])
                row = self.node_rail_link[node]
                live = [r % self.rails for r in range(rail + 1, rail + self.rails)
                        if row[r % self.rails] >= 0 and up_g[row[r % self.rails]]]
                if not live:
                    continue
                alt = live[0]
                for n in {node, int(self.ring_prev[node]), int(self.ring_next[node])}:
                    target = self.node_rail_link[n, alt]
                    if target >= 0 and up_g[target]:
                        extra[target] += demand[k]
                        self.reroute_source[gl[target]] = gl[k]
            demand = demand + extra
        demand = np.where(up_g, demand, 0.0)
        rho_g = demand / rate_g
        # uplinks: cross-SU share of each leaf's traffic over its live uplinks
        ul = self.up_links
        rho_leaf = np.zeros(self.n_switches)
        util_up = np.zeros(len(ul))
        rho_up = np.zeros(len(ul))
        if len(ul):
            up_u = link_up[ul]
            cross = self.cross[jj] * on_job
            leaf_demand = np.bincount(self.gl_leaf, weights=demand * cross, minlength=self.n_switches)
            leaf_bytes = np.bincount(self.gl_leaf, weights=np.minimum(rho_g, 1.0) * rate_g * ctf * cross,
                                     minlength=self.n_switches)
            live_up = np.bincount(self.ul_leaf, weights=up_u.astype(np.float64), minlength=self.n_switches)
            cap = np.maximum(live_up, 1.0) * facts.LINK_RATE_UPLINK_BPS
            rho_leaf = leaf_demand / cap
            rho_up = np.where(up_u, rho_leaf[self.ul_leaf], 0.0)
            util_up = np.where(up_u, np.minimum(leaf_bytes / cap, 1.0)[self.ul_leaf], 0.0)
            n_up_leaf = np.bincount(self.ul_leaf, minlength=self.n_switches)
            degraded_leaf = live_up < n_up_leaf
            if degraded_leaf.any():
                down_ul = ul[~up_u]
                src = np.full(self.n_switches, -1, dtype=np.int64)
                src[self.ul_leaf[~up_u]] = down_ul
                carriers = up_u & degraded_leaf[self.ul_leaf]
                self.reroute_source[ul[carriers]] = src[self.ul_leaf[carriers]]
        # a job's communication stretches by the worst over-subscription on its path
        path_rho = np.maximum(rho_g, np.where(self.cross[jj] * on_job > 0, rho_leaf[self.gl_leaf], 0.0))
        self.job_comm_slowdown = np.ones_like(self.job_comm_slowdown)
        if on_job.any():
            np.maximum.at(self.job_comm_slowdown, jj[on_job], path_rho[on_job])
        # per-link view
        self.rho[:] = 0.0
        self.rho[gl] = rho_g
        self.rho[ul] = rho_up
        self.util[:] = 0.0
        self.util[gl] = np.minimum(rho_g, 1.0) * ctf
        self.util[ul] = util_up
        comm_frac = np.zeros(self.n)
        comm_frac[gl] = ctf
        if len(ul):
            comm_frac[ul] = np.where(rho_up > 0, np.minimum(util_up / np.maximum(np.minimum(rho_up, 1.0), 1e-9), 1.0), 0.0)
        self._count(dt, link_up, comm_frac)

    def _count(self, dt: float, link_up: np.ndarray, comm_frac: np.ndarray) -> None:
        p, c = self.params, self.counters
        rho = self.rho
        tx = self.util * self.rate / 8.0 * dt  # bytes
        c["tx_data"] += tx
        c["rx_data"] += tx * 0.999
        overload = np.where(rho > 1.0, 1.0 - 1.0 / np.maximum(rho, 1e-9), 0.0)
        # ground truth: over-subscribed *and* stalled for a measurable share of the time — an
        # over-subscribed link whose job barely communicates (a float residue of a share) is not
        # congested, and no counter could show it
        self.congested = link_up & (overload * comm_frac >= p.congestion_min_stall)
        wait_frac = overload * comm_frac + 2e-4 * self.util
        c["xmit_wait"] += self.tick_rate * wait_frac * dt
        c["pfc_pause_duration"] += 0.8 * overload * comm_frac * dt + 1e-6 * self.util * dt
        packets = tx / p.mtu_bytes
        mark = 0.3 * np.clip((rho - p.ecn_start_ratio) / 0.1, 0.0, 1.0) + 1e-6
        marked = packets * mark
        c["ecn_marked"] += marked
        c["cnp_sent"] += marked * 0.5
        c["cnp_handled"] += marked * 0.49
        c["xmit_discards"] += np.where(rho > 1.5, packets * 1e-6, 0.0)
        c["buffer_overrun_errors"] += 0.0

    def add_optic_errors(self, downs: np.ndarray, recoveries: np.ndarray, symbol_errors: np.ndarray) -> None:
        c = self.counters
        c["link_downed"] += downs
        c["link_error_recovery"] += recoveries
        c["symbol_error"] += symbol_errors
        c["rcv_errors"] += np.floor(symbol_errors * 0.5)
        c["link_integrity_errors"] += downs * 2.0

    def readings(self, link_up: np.ndarray) -> dict[str, np.ndarray]:
        """Link frame columns: counters as the port reports them (integers, optional wrap)."""
        out: dict[str, np.ndarray] = {}
        wrap_at = 2.0 ** self.params.counter_bits if self.params.counter_bits < 64 else None
        for name in LINK_COUNTERS:
            value = self.counters[name]
            unit = _WORD_BYTES.get(name, 1.0)
            if name not in _FLOAT_COUNTERS:
                value = np.floor(value / unit)
            else:
                value = np.floor(value * 1e6) / 1e6  # microsecond resolution
            if wrap_at is not None and name not in _FLOAT_COUNTERS:
                value = np.mod(value, wrap_at)
            out[name] = value * unit
        out["link_state"] = np.where(link_up, float(facts.IB_PORT_STATE_ACTIVE), float(facts.IB_PORT_STATE_DOWN))
        out["link_rate"] = self.rate.astype(np.float64)
        return out
