"""Every ``chaosctl bench`` command has help, and a bad value is one line on stderr, exit 2.

Bad values are rejected before anything starts (no cluster, namespace or child process), so
these run the real console script without root and in seconds.
"""

from __future__ import annotations

import pytest

from tests.cli.conftest import assert_one_line_error, run_ctl

pytestmark = pytest.mark.timeout(120)

COMMANDS = ["allreduce", "planner", "loopback", "stall", "duty-cycle", "control", "scaleout",
            "convergence", "soak"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help(command: str) -> None:
    proc = run_ctl("bench", command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Usage: chaosctl bench " + command in proc.stdout


def test_group_lists_every_command() -> None:
    listing = run_ctl("bench", "--help").stdout
    assert all(c in listing for c in COMMANDS)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["allreduce", "--mb", "0"], "--mb"),
        (["allreduce", "--chunk-kb", "big"], "--chunk-kb"),
        (["allreduce", "--result", "stale"], "fresh, reuse"),
        (["planner", "--models", "resnet9000"], "unknown model 'resnet9000'"),
        (["planner", "--models", "synth-4"], "unknown model"),  # the planner takes paper models
        (["planner", "--seed", "x"], "--seed"),
        (["loopback", "--neighbors", "7", "--nodes", "6"], "cannot exceed --nodes"),
        (["loopback", "--planner", "fastest"], "--planner"),
        (["loopback", "--models", "synth-0"], "synth-MIB"),
        (["loopback", "--bw-scale", "0"], "--bw-scale"),
        (["stall", "--nodes", "2"], "--nodes"),
        (["stall", "--from", "/nonexistent/kept"], "events.json is missing"),
        (["duty-cycle", "--rates", "fast"], "--rates"),
        (["duty-cycle", "--probes", "0"], "--probes"),
        (["convergence", "--at", "20"], "must be below the epochs"),
        (["convergence", "--models", "resnet"], "not one of cnn, chartf"),
        (["convergence", "--modes", "fast"], "not one of plain, consistent"),
        (["soak", "--minutes", "0"], "--minutes"),
        (["soak", "--kinds", "nap"], "not one of join, leave"),
        (["soak", "--bw", "fast"], "fast"),
        (["soak", "--minutes", "1", "--warmup", "60"], "--warmup"),
        (["soak", "--nodes", "2"], "--nodes"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_bad_value_is_one_line_exit_2(args: list[str], needle: str) -> None:
    line = assert_one_line_error(run_ctl("bench", *args), 2)
    assert needle in line
