"""``chaosctl demo`` end to end with real chaosd processes, and its teardown.

These need the daemon (``daemon.agent.main`` and ``daemon.agent.broker``); they skip without it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from chaosctl.cluster import Child, LocalCluster
from tests.cli.conftest import chaosctl_argv, ctl_env, run_ctl

pytestmark = pytest.mark.timeout(280)

DIR_RE = re.compile(r"dir (/\S+chaos-demo-\S+)")


def needs_daemon() -> None:
    for module in ("daemon.agent.main", "daemon.agent.broker"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not there yet")


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (the demo's temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and "Z" not in _state(entry):
            found.append(int(entry.name))
    return found


def _state(entry: Path) -> str:
    try:
        return (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_demo_runs_and_leaves_nothing_behind() -> None:
    needs_daemon()
    proc = run_ctl("demo", "--no-live", "--duration", "0", timeout=250)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    out = proc.stdout
    for needle in ("kill -9", "failed", "failover", "term", "is back as", "measured delays",
                   "bootstrapped the cluster", "scaled out in", "link add", "link del",
                   "left gracefully", "kept training", "loss"):
        assert needle in out, needle
    match = DIR_RE.search(out)
    assert match, out
    assert not Path(match.group(1)).exists()  # removed without --keep-dir
    assert pids_mentioning(match.group(1)) == []


def test_demo_ctrl_c_tears_everything_down() -> None:
    needs_daemon()
    proc = subprocess.Popen(
        [*chaosctl_argv(), "demo", "--no-live", "--keep-dir"], env=ctl_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    workdir = None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if workdir is None and (match := DIR_RE.search(line)):
            workdir = match.group(1)
        if "kill -9" in line or time.monotonic() > deadline:
            break
    assert workdir, "the demo never said where it runs"
    assert pids_mentioning(workdir), "no node was running"
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # it ignored the Ctrl-C: fail, but take the demo down
        proc.communicate(timeout=15)
        raise
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert pids_mentioning(workdir) == []
    subprocess.run(["rm", "-rf", workdir], check=False)


def test_close_kills_grandchildren(tmp_path: Path) -> None:
    # A child that forked and ignores SIGTERM: close() escalates and kills the whole group.
    cluster = LocalCluster(tmp_path, 1)
    script = "trap '' TERM; sleep 300 & sleep 300; wait"
    child = Child("node-1", ["sh", "-c", script], tmp_path / "node-1.log")
    cluster.nodes["node-1"] = child
    cluster._spawn(child)
    assert child.proc is not None
    time.sleep(0.3)
    pgid = os.getpgid(child.proc.pid)
    assert pgid != os.getpgid(0)  # its own group, away from our Ctrl-C
    cluster.close(grace=0.5)  # returns (a close that waited out the sleep would time out)
    assert not child.alive()
    # SIGKILL is delivered at once, but an orphan takes a moment to finish exiting.
    deadline = time.monotonic() + 3
    while live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_members(pgid) == []


def live_members(pgid: int) -> list[int]:
    """Running members of a process group (zombies don't count: in a container nobody may
    reap the orphans, but they hold no resources)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_demo_rejects_too_few_nodes() -> None:
    proc = subprocess.run([*chaosctl_argv(), "demo", "--nodes", "2"], env=ctl_env(),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and "--nodes" in proc.stderr
