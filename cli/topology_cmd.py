"""``foreshock topology``: check a file (``show``), say what a hardware change keeps (``diff``),
and rewrite a file's jobs from Slurm's running jobs (``jobs``).

The hardware part of the file is kept as it is (its fingerprint too, so agents that publish
GPU, BMC or CDU rows need not restart); only ``jobs`` changes. The file is regenerated from the
loaded topology: its entities and the site's own ``x-`` keys are kept, its comments and layout
are not. The file is replaced atomically (where it is a symlink, its target is: the link stays,
pointing at the new file) and left untouched when the job list is the same, so a periodic job
can restart the workers only when the summary says ``"changed": true``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO

import click
from rich.console import Console
from rich.markup import escape

from foreshock.health import PipelineHealth
from foreshock.remap import HARDWARE_KINDS, Remap
from foreshock.streams.kafka_codec import PartitionMap
from foreshock.streams.polling import run_command
from foreshock.streams.slurm import jobs_from_squeue, with_jobs
from foreshock.topology import Topology, TopologyError, take_or

from .common import counted


@click.group(name="topology")
def command() -> None:
    """Topology files: check one, compare two, and rewrite one's jobs from the scheduler."""


@command.command(name="show")
@click.argument("topology_path", metavar="TOPOLOGY", type=click.Path(exists=True, dir_okay=False))
def show(topology_path: str) -> None:
    """Check TOPOLOGY and print what it holds and its fingerprints.

    A worker dead-letters an agent's records as `topology_mismatch` naming both fingerprints
    (hardware, and the job list apart): this says which file is which."""
    try:
        topology = Topology.load(topology_path)
    except TopologyError as exc:
        raise click.ClickException(str(exc)) from None
    sizes = {kind: topology.size(kind) for kind in ("gpu", "node", "rack", "link", "optic", "job")}
    held = [counted(len(topology.loops), "cooling loop"), *(counted(sizes[kind], label) for kind, label in (
        ("rack", "rack"), ("node", "node"), ("gpu", "GPU"), ("link", "link"), ("optic", "optic"))),
        counted(len(topology.switches), "switch", "switches"), counted(sizes["job"], "job")]
    Console().print(f"{escape(topology_path)}: cluster {escape(topology.cluster)}, {', '.join(held)}; "
                    f"fingerprints: hardware {topology.fingerprint()}, jobs {topology.fingerprint(jobs=True)}")
    print(json.dumps({"name": "topology show", **sizes, "hardware": topology.fingerprint(),
                      "jobs_fingerprint": topology.fingerprint(jobs=True)}))


@command.command(name="diff")
@click.argument("old_path", metavar="OLD", type=click.Path(exists=True, dir_okay=False))
@click.argument("new_path", metavar="NEW", type=click.Path(exists=True, dir_okay=False))
@click.option("--partitions", type=click.IntRange(min=1), default=8, show_default=True,
              help="Partitions of the frames topic (the workers' --partitions).")
def diff(old_path: str, new_path: str, partitions: int) -> None:
    """What workers restarted with NEW after running with OLD keep of what they learnt.

    Each entity still listed under its name keeps its state, unless it now falls to another
    partition (partitions follow racks in the order the file lists them): there it starts fresh,
    as new entities do. List new racks after the old ones to keep every rack's partition."""
    try:
        old, new = Topology.load(old_path), Topology.load(new_path)
    except TopologyError as exc:
        raise click.ClickException(str(exc)) from None
    old_parts, new_parts = PartitionMap(old, partitions).by_kind, PartitionMap(new, partitions).by_kind
    listed = Remap(old, new)
    # an entity keeps its state where its partition is the one it had (take_or: OLD may have
    # none of a kind NEW adds, its first links or GPUs, and an empty array cannot be indexed)
    same = {kind: (listed.old_of_new[kind] >= 0)
            & (new_parts[kind] == take_or(old_parts[kind], listed.old_of_new[kind]))
            for kind in HARDWARE_KINDS}
    kept = Remap(old, new, keep=same)
    summary: dict[str, dict[str, int]] = {}
    for kind in HARDWARE_KINDS:
        still = int((listed.old_of_new[kind] >= 0).sum())
        summary[kind] = {"old": old.size(kind), "new": new.size(kind), "kept": kept.kept(kind),
                         "moved_partition": still - kept.kept(kind), "added": new.size(kind) - still,
                         "removed": old.size(kind) - still}
    console = Console()
    same_hardware = old.fingerprint() == new.fingerprint()
    console.print(f"hardware {old.fingerprint()} -> {new.fingerprint()}"
                  f"{' (the same: checkpoints load as they are)' if same_hardware else ''}; {partitions} partitions")
    for kind, row in summary.items():
        console.print(f"  {kind + 's':7} {row['kept']:>6} keep their state, {row['added']:>5} new, "
                      f"{row['moved_partition']:>5} move to another partition (start fresh), {row['removed']:>5} removed")
    if summary["rack"]["moved_partition"]:
        console.print("  racks listed in a new place move partitions: list new racks after the old ones to keep them")
    print(json.dumps({"name": "topology diff", "partitions": partitions, "same_hardware": same_hardware,
                      "old_hardware": old.fingerprint(), "new_hardware": new.fingerprint(), **summary}))


@command.command(name="jobs")
@click.argument("topology_path", metavar="TOPOLOGY", type=click.Path(exists=True, dir_okay=False))
@click.option("--squeue-json", type=click.File("r", encoding="utf-8", errors="replace"), default=None,
              help="Read this `squeue --json --all` output ('-': standard input) instead of running squeue.")
@click.option("--squeue", "squeue_exe", default="squeue", show_default=True,
              help="The squeue program to run (as `squeue --json --all --states=RUNNING`, by a user who "
                   "sees every job: PrivateData=jobs hides other users' jobs).")
@click.option("--min-nodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Leave out jobs on fewer nodes of the topology.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write here instead of replacing TOPOLOGY (either is written anew: comments are not kept, "
                   "x- keys are).")
@click.option("--dry-run", is_flag=True, help="Say what would change; write nothing.")
def jobs(topology_path: str, squeue_json: IO[str] | None, squeue_exe: str, min_nodes: int, output: str | None,
         dry_run: bool) -> None:
    """Replace TOPOLOGY's jobs with Slurm's running jobs (`squeue --json`).

    A job is named JOBID:NAME and lists the topology's nodes it runs on (a byte of a name that is
    not UTF-8, a Latin-1 job name, is read as U+FFFD). Left out, and counted: jobs not running, on
    no node of the topology, using part of a node (fewer GPUs than its nodes have, where squeue
    gives them), on a node another running job uses too (all of them), or on fewer than
    --min-nodes. When the list changed, restart the workers with the new file (their checkpoints
    find each job still listed again).

    The file is written anew from the topology it holds: its `x-` keys are kept, its comments
    and layout are not (keep notes under `x-` keys). A symlinked TOPOLOGY has its target
    replaced, the link left as it is.

    squeue is run with --all (jobs in hidden partitions too), and must be able to see every user's
    jobs: with PrivateData=jobs, run it as SlurmUser, root or an operator, or a job it cannot see
    reads as ended and its nodes as free."""
    console = Console()
    try:
        topology = Topology.load(topology_path)
    except TopologyError as exc:
        raise click.ClickException(str(exc)) from None
    if squeue_json is not None:
        text = squeue_json.read()
    else:
        # --all: by default squeue hides jobs in hidden partitions and in partitions the caller's
        # group cannot use; their jobs would read as ended and their nodes as free
        out, why = run_command([squeue_exe, "--json", "--all", "--states=RUNNING"], PipelineHealth(), "slurm",
                               timeout=60.0)
        if out is None:
            raise click.ClickException(f"squeue failed: {why.strip()}")
        text = out
    try:
        found = jobs_from_squeue(text, topology, min_nodes)
        updated = with_jobs(topology, found.jobs)
    except (ValueError, TopologyError) as exc:
        raise click.ClickException(f"squeue output: {exc}") from None

    before, after = set(topology.jobs), set(updated.jobs)
    changed = updated.fingerprint(jobs=True) != topology.fingerprint(jobs=True)
    target = Path(output) if output else Path(topology_path)
    written = changed or target != Path(topology_path)
    if written and not dry_run:
        _replace(target, updated)

    covered = sum(len(j["nodes"]) for j in found.jobs)
    jobs = len(found.jobs)
    console.print(f"{jobs} running job{'' if jobs == 1 else 's'} on {covered} of {len(topology.nodes)} nodes; "
                  f"{len(after - before)} new, {len(before - after)} ended")
    for reason, n in sorted(found.left_out.items()):
        console.print(f"  left out: {n} {escape(reason)}")
    if found.unknown_nodes:
        names = ", ".join(sorted(found.unknown_nodes)[:5])
        console.print(f"  {len(found.unknown_nodes)} nodes not in the topology were dropped from jobs: "
                      f"{escape(names)}{', ...' if len(found.unknown_nodes) > 5 else ''}")
    verb = "would write" if dry_run else "wrote"
    console.print(f"{verb} {escape(str(target))}" if written else f"unchanged: {escape(str(target))} lists these jobs")
    print(json.dumps({"name": "topology jobs", "jobs": len(found.jobs), "changed": changed,
                      "written": written and not dry_run, "left_out": dict(found.left_out),
                      "unknown_nodes": len(found.unknown_nodes), "hardware": updated.fingerprint(),
                      "jobs_fingerprint": updated.fingerprint(jobs=True)}))


def _replace(path: Path, topology: Topology) -> None:
    """Write beside ``path`` and rename over it: a worker starting meanwhile reads the old file or
    the new one, never half of one. A symlink is followed first: renaming over the link itself
    left the link's target (the file in a config repository, say) without the new jobs and put a
    plain file where the link was."""
    path = path.resolve()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        topology.dump(tmp)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)  # mkstemp's 0600 would lock other users out
        else:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
