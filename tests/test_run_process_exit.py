"""A command has ended when it exits, not when its pipes close: a wrapper that prints its output
and exits 0, leaving a process in the background that holds its stdout (an ssh ControlPersist
master, a helper daemon started on demand), timed out at every poll and its output was lost."""

from __future__ import annotations

from pathlib import Path

from foreshock.health import PipelineHealth
from foreshock.streams.polling import run_process

from test_streams_polling import _ended_within


def test_a_command_that_exits_leaving_a_process_holding_its_output_is_read_whole(tmp_path: Path) -> None:
    """Its output read whole (more than a pipe holds, so it is read while the command runs; its
    CRLF read as text mode reads it), its exit status kept, nothing counted, and the process it
    left behind killed with its group."""
    pid_file = tmp_path / "helper.pid"
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\n"
                      "printf 'header\\r\\n'\n"
                      "i=0; while [ $i -lt 20000 ]; do echo \"row $i of a page longer than a pipe holds\"; "
                      "i=$((i + 1)); done\n"
                      "echo 'a word on stderr' >&2\nexit 0\n")
    script.chmod(0o755)
    health = PipelineHealth()
    done, why = run_process([str(script)], health, "t", timeout=20.0)
    assert why == "" and done is not None, why
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0] == "header" and len(lines) == 20001 and lines[-1].startswith("row 19999 ")
    assert done.stderr == "a word on stderr\n"
    assert not health.problems
    assert _ended_within(int(pid_file.read_text()), 10.0)
