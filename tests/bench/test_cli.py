"""Every ``chaosctl bench`` command has help, and a bad value is one line on stderr, exit 2.

Bad values are rejected before anything starts (no cluster, namespace or child process), so
these run without root and in seconds: the help through the real console script, the tables
of bad values through the same ``chaosctl.main.run`` in this process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.cli.conftest import (
    assert_one_line_error,
    chaosctl_argv,
    ctl_env,
    run_ctl,
    run_ctl_here,
)

pytestmark = pytest.mark.timeout(120)

COMMANDS = ["allreduce", "planner", "loopback", "stall", "duty-cycle", "control", "scaleout",
            "convergence", "soak", "throughput"]


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
        (["stall", "--model", "resnet"], "not one of mlp, cnn, chartf, dense-25m"),
        (["stall", "--model", "cnn,chartf"], "one model a run"),
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
        (["throughput", "--batch", "20"], "not a multiple of 16"),
        (["throughput", "--model", "resnet"], "not one of cnn, chartf, dense-25m"),
        (["throughput", "--arms", "ddp,nccl"], "nccl is not one of ddp, chaos, chaos-overlap"),
        (["throughput", "--nodes", "1"], "--nodes"),
        (["throughput", "--steps", "0"], "--steps"),
        (["throughput", "--mbit", "0"], "--mbit"),
        (["throughput", "--mbit-max", "100"], "--mbit-max: give --mbit too"),
        (["throughput", "--wire", "fp8"], "--wire"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_bad_value_is_one_line_exit_2(args: list[str], needle: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    line = assert_one_line_error(run_ctl_here("bench", *args, monkeypatch=monkeypatch), 2)
    assert needle in line


#: Every bench that writes results, and how it is told where.
WRITERS = [[c, "--out"] for c in ("allreduce", "planner", "loopback", "stall", "control",
                                  "scaleout", "convergence", "soak", "simulate", "slowlinks",
                                  "adaptive", "dst", "check", "signing", "snapshots",
                                  "throughput")]
WRITERS += [["throughput", "--keep"], ["stall", "--keep"], ["convergence", "--keep"],
            ["soak", "--keep"], ["duty-cycle", "--json"]]


@pytest.mark.parametrize("args", WRITERS, ids=" ".join)
def test_results_that_cannot_be_written_are_refused_before_anything_starts(
        tmp_path: Path, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A path under a file can never be made: one line naming the option, exit 2, and
    nothing made or started (a run used to fail only when it wrote, at the end)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = assert_one_line_error(
        run_ctl_here("bench", *args, str(blocker / "results"), monkeypatch=monkeypatch), 2)
    assert line.startswith(f"chaosctl: {args[1]} {blocker / 'results'}: ")
    assert "is not a folder" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.timeout(180)
def test_a_bench_stopped_by_sigterm_twice_tears_down_what_it_started(tmp_path: Path) -> None:
    """SIGTERM (``timeout``, systemd) unwinds a bench like Ctrl-C, and a second one during
    the teardown is ignored: no process of its cluster, nor its temp dir, is left. (Dying on
    the spot, as SIGTERM's default does, left mosquitto, namespaces and temp dirs behind.)"""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**ctl_env(), "TMPDIR": str(tmp)}  # every temp dir of the run is in here
    log = tmp_path / "bench.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [*chaosctl_argv(), "bench", "control", "--sizes", "3", "--repeats", "3", "--out",
             str(tmp_path / "out")], env=env, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(_started_in(tmp)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_started_in(tmp)) >= 3, log.read_text()[-2000:]  # a broker and chaosd
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 130, text[-2000:]
    assert "SIGTERM: tearing down" in text and "Traceback" not in text
    assert _started_in(tmp) == []
    assert list(tmp.iterdir()) == []


def _started_in(folder: Path) -> list[int]:
    """Live processes whose command line names ``folder``."""
    return [p.pid for p in psutil.process_iter() if _alive(p) and
            str(folder) in " ".join(_cmdline(p))]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
