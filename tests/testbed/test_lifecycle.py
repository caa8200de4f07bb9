"""Tear-down: after ``down``, a crash of the process holding the testbed, or Ctrl-C of
``up --foreground``, no namespace, veth, process, socket or state file is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from chaosctl.testbed.core import Testbed
from chaosctl.testbed.state import STATE_FILE, TestbedError, TestbedState
from netprobe import netns
from tests.cli.conftest import chaosctl_argv, run_ctl
from tests.testbed.conftest import need_root, run_id, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]
MakeTestbed = Callable[..., Testbed]

HOLDER = """
import sys, time
from chaosctl.testbed.core import Testbed
tb = Testbed(sys.argv[1], 3, "line", run_id=sys.argv[2], redraw_period_s=1.0)
tb.up()
print("ready", flush=True)
time.sleep(600)
"""


def assert_gone(state: TestbedState, files: bool = True) -> None:
    """Nothing the state names (or that carries its prefix) exists any more.

    ``files=False`` skips the sockets and the state file, for when a newer testbed in the same
    directory owns those paths now.
    """
    assert netns.list_netns(state.prefix) == []
    assert netns.list_links(state.prefix) == []
    for rec in state.procs:
        if psutil.pid_exists(rec.pid):
            proc = psutil.Process(rec.pid)
            assert (abs(proc.create_time() - rec.create_time) > 0.05
                    or proc.status() == psutil.STATUS_ZOMBIE), f"{rec.name} is still running"
    if not files:
        return
    for node in state.nodes.values():
        assert not Path(node.socket).exists(), f"{node.socket} left behind"
    assert not (Path(state.dir) / STATE_FILE).exists()


def test_down_leaves_nothing(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(3, "full", redraw_period_s=1.0)
    state = TestbedState.load(tb.dir)
    assert state is not None and len(state.procs) == 5  # broker, 3 chaosd, the redrawer
    assert len(netns.list_netns(state.prefix)) == 4
    tb.exec("n2", ["sleep", "300"])  # a stray command in a node dies with its namespace
    report = tb.down()
    assert len(report.namespaces) == 4
    assert_gone(state)
    tb.down()  # twice is fine


def test_crash_of_the_holder_then_down_and_up_again(tmp_path: Path) -> None:
    need_root()
    directory, rid = tmp_path / "tb", run_id()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), rid],
                              stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"ready"
        os.kill(holder.pid, signal.SIGKILL)  # no finally, no atexit: only the state file
        holder.wait(10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
    state = TestbedState.load(directory)
    assert state is not None and netns.list_netns(state.prefix)
    alive = [r for r in state.procs if psutil.pid_exists(r.pid)]
    assert len(alive) == 5  # the testbed outlived its holder

    # The next `up` in the same directory removes the crashed one first, and its nodes'
    # data: a term remembered from a cluster that is gone kept every new chaosd out of the
    # election for its orphan delay.
    marker = Path(state.nodes["n1"].data_dir) / "left-by-the-crashed-testbed"
    marker.write_text("old")
    try:
        up = run_ctl("testbed", "up", "--nodes", "2", "--topology", "line", "--dir",
                     str(directory), timeout=90)
        assert up.returncode == 0, up.stderr
        assert "removed a testbed left in" in up.stdout
        assert not marker.exists()
        assert_gone(state, files=False)
        second = TestbedState.load(directory)
        assert second is not None and second.prefix != state.prefix
    finally:
        down = run_ctl("testbed", "down", "--dir", str(directory), timeout=60)
    assert down.returncode == 0, down.stderr
    assert_gone(second)


def test_cli_drives_a_testbed(tmp_path: Path) -> None:
    need_root()
    directory = str(tmp_path / "tb")
    up = run_ctl("testbed", "up", "-n", "3", "--topology", "line", "--bw", "50-60", "--seed",
                 "4", "--dir", directory, "--json", timeout=90)
    assert up.returncode == 0, up.stderr
    state = TestbedState.load(directory)
    assert state is not None
    try:
        snap = json.loads(up.stdout)
        assert [n["node"] for n in snap["nodes"]] == ["n1", "n2", "n3"]
        assert [(ln["a"], ln["b"], ln["state"]) for ln in snap["links"]] == [
            ("n1", "n2", "up"), ("n2", "n3", "up")]
        assert all(50 <= ln["mbit"] <= 60 for ln in snap["links"])
        assert len({n["scheduler"] for n in snap["nodes"]}) == 1

        inner = run_ctl("testbed", "exec", "--dir", directory, "n2", "--", *chaosctl_argv(),
                        "status", "--json")
        assert inner.returncode == 0, inner.stderr
        assert json.loads(inner.stdout)["node"] == "n2"  # CHAOS_SOCKET named n2's chaosd

        assert run_ctl("testbed", "cut", "n1", "n2", "--dir", directory).returncode == 0
        assert run_ctl("testbed", "shape", "n2", "n3", "--mbit", "77", "--dir",
                       directory).returncode == 0
        links = json.loads(run_ctl("testbed", "status", "--dir", directory, "--json").stdout)
        assert [(ln["state"], ln["mbit"]) for ln in links["links"]] == [
            ("cut", links["links"][0]["planned_mbit"]), ("up", 77)]
        assert run_ctl("testbed", "heal", "n2", "n1", "--dir", directory).returncode == 0
        bad = run_ctl("testbed", "cut", "n1", "n3", "--dir", directory)
        assert bad.returncode == 1 and "not neighbours" in bad.stderr
    finally:
        down = run_ctl("testbed", "down", "--dir", directory, timeout=60)
    assert down.returncode == 0, down.stderr
    assert_gone(state)


def test_foreground_up_is_removed_on_ctrl_c(tmp_path: Path) -> None:
    need_root()
    directory = tmp_path / "tb"
    proc = subprocess.Popen([*chaosctl_argv(), "testbed", "up", "-n", "2", "--topology", "line",
                             "--dir", str(directory), "--foreground"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        wait_until(lambda: (s := TestbedState.load(directory)) and len(s.procs) == 3, 60,
                   "the testbed's processes")
        state = TestbedState.load(directory)
        assert state is not None
        wait_until(lambda: Testbed.attach(directory).agreed(), 30, "an election")
        time.sleep(1.5)  # at least one refresh of the live table
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    assert b"removed 3 namespaces" in out
    assert_gone(state)


def test_a_failed_up_removes_what_it_built(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(3, "line", up=False)
    with pytest.raises(TestbedError, match="timed out"):
        tb.up(wait_s=0.01)  # no election that fast: up() fails after building everything
    state = tb.state
    assert state.procs  # it had started processes
    assert_gone(state)


@pytest.mark.parametrize("after_s", [1.0, 2.0])
def test_ctrl_c_during_up_leaves_nothing(tmp_path: Path, after_s: float) -> None:
    need_root()
    directory = tmp_path / "tb"
    proc = subprocess.Popen([*chaosctl_argv(), "testbed", "up", "-n", "3", "--dir",
                             str(directory)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    # Into the build, not the interpreter's start: on a loaded box that alone can take a
    # second (a Ctrl-C while the CLI imports is test_cli's).
    wait_until(lambda: directory.exists() or proc.poll() is not None, 60, "the build to start")
    time.sleep(after_s - 1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    state = TestbedState.load(directory)
    if proc.returncode == 0:  # it was faster than the signal: remove it the normal way
        assert state is not None
        assert run_ctl("testbed", "down", "--dir", str(directory)).returncode == 0
    else:
        assert proc.returncode == 130, err
        assert "Traceback" not in err.decode()
        assert state is None
    for name in netns.list_netns("chaos-"):
        assert str(directory) not in " ".join(_cmdline(p) for p in netns.netns_pids(name))


def _cmdline(pid: int) -> str:
    """A process's command line, or "" if it ended since it was listed (another test's
    namespaces come and go meanwhile: a full run once failed here on NoSuchProcess)."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""
