"""chaosctl against a fake daemon: JSON passthrough, tables, errors, watch and follow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import (
    FakeDaemon,
    assert_one_line_error,
    chaosctl_argv,
    ctl_env,
    fail,
    ok,
    run_ctl,
)

pytestmark = pytest.mark.timeout(120)

STATUS = {
    "cluster": "lab",
    "node": "node-2",
    "scheduler": {"id": "node-1", "term": 4},
    "nodes": {"active": 2, "failed": 1},
    "step": 1200,
    "policy_version": 7,
}
NODES: list[dict[str, Any]] = [
    {"id": "node-1", "state": "active", "addr": "10.0.0.1:7070", "scheduler": True,
     "heartbeat_age_s": 0.21, "step": 1200, "neighbors": ["node-2"]},
    {"id": "node-2", "state": "active", "addr": "10.0.0.2:7070", "scheduler": False,
     "heartbeat_age_s": 0.0, "step": 1200, "neighbors": ["node-1"]},
    {"id": "node-3", "state": "failed", "addr": "10.0.0.3:7070", "scheduler": False,
     "heartbeat_age_s": None, "step": None, "neighbors": []},
]
LINKS = [{"a": "node-1", "b": "node-2", "state": "up", "rtt_ms": 0.42,
          "bandwidth_mbps": 941.5, "measured_at": 1700000000.5}]
EVENTS = [
    {"seq": 1, "ts": 1700000000.0, "kind": "scheduler-elected", "node": "node-1", "peer": None,
     "term": 4, "delay_ms": 2300.0},
    {"seq": 2, "ts": 1700000001.0, "kind": "node-failed", "node": "node-3", "peer": None,
     "term": 4, "delay_ms": 812.0, "reason": "last-will"},
]
PROBE = {"peer": "node-2", "rtt_ms": 0.3, "bandwidth_mbps": 900.0, "method": "iperf3",
         "measured_at": 1700000002.0}
DATA: dict[str, Any] = {"status": STATUS, "nodes": NODES, "links": LINKS, "events": EVENTS,
                        "probe": PROBE}


@pytest.fixture
def daemon(fake: FakeDaemon) -> FakeDaemon:
    fake.answers.update({op: ok(data) for op, data in DATA.items()})
    fake.answers["ping"] = ok({"node": "node-2", "pid": 42, "uptime_s": 1.0})
    return fake


def ctl(daemon: FakeDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    return run_ctl("--socket", str(daemon.path), *args)


@pytest.mark.parametrize(
    ("args", "op"),
    [(["status"], "status"), (["nodes"], "nodes"), (["links"], "links"),
     (["events"], "events"), (["probe", "node-2"], "probe")],
)
def test_json_is_the_daemons_data(daemon: FakeDaemon, args: list[str], op: str) -> None:
    proc = ctl(daemon, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == DATA[op]
    assert proc.stderr == ""


def test_requests_follow_the_protocol(daemon: FakeDaemon) -> None:
    daemon.answers["join"] = ok({"node": "node-2", "state": "joining"})
    daemon.answers["link"] = ok({"a": "node-2", "b": "node-3", "state": "up"})
    assert ctl(daemon, "events", "--limit", "5").returncode == 0
    proc = ctl(daemon, "join", "-n", "node-1", "--neighbor", "node-3", "--",
               "python", "train.py", "--lr", "0.1")
    assert proc.returncode == 0, proc.stderr
    assert "node-2: joining" in proc.stdout
    proc = ctl(daemon, "link", "add", "node-3")
    assert "link node-2 -- node-3: up" in proc.stdout
    assert [r["v"] for r in daemon.requests] == [1, 1, 1]
    assert daemon.requests[0] == {"v": 1, "op": "events", "args": {"since": 0, "limit": 5}}
    join = daemon.requests[1]["args"]
    # The daemon runs the command where and as the caller would (and remembers both).
    assert join.pop("cwd") == str(Path.cwd()) and join.pop("env")["PATH"] == os.environ["PATH"]
    assert join == {
        "neighbors": ["node-1", "node-3"], "command": ["python", "train.py", "--lr", "0.1"]}
    assert daemon.requests[2]["args"] == {"action": "add", "peer": "node-3"}


def test_policy_set_show_and_auto(daemon: FakeDaemon) -> None:
    """``chaosctl policy``: the request carries only what is named; the policy shows its mode
    and pins; bad values are usage errors (exit 2) before any request."""
    daemon.answers["policy"] = lambda req: ok({"requested": req["args"]})
    proc = ctl(daemon, "policy", "set", "--sync", "streaming", "-H", "20", "--fragments", "4",
               "--overlap")
    assert proc.returncode == 0, proc.stderr
    assert "sent to the scheduler" in proc.stdout
    assert daemon.requests[-1]["args"] == {"sync": "streaming", "inner_steps": 20,
                                           "fragments": 4, "overlap": "on"}
    assert ctl(daemon, "policy", "auto").returncode == 0
    assert daemon.requests[-1]["args"] == {"auto": True}
    sent = len(daemon.requests)
    for bad in (["--sync", "local"], ["--wire", "fp8"], ["-H", "0"], []):
        proc = ctl(daemon, "policy", "set", *bad)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) >= 1, bad
    assert len(daemon.requests) == sent
    daemon.answers["policy"] = fail("policy: the cluster cannot run diloco: node-3 cannot: "
                                    "diloco mode does not support a GradScaler")
    proc = ctl(daemon, "policy", "set", "--sync", "diloco")
    assert proc.returncode == 1 and "GradScaler" in proc.stderr
    daemon.answers["policy.show"] = ok({
        "version": 7, "members": ["node-1", "node-2"], "edges": [["node-1", "node-2"]],
        "root": "node-1", "effective_step": 120, "addrs": {}, "wire": "int8",
        "sync": {"mode": "diloco", "inner_steps": 20}, "chunk_kib": 0, "pinned": ["sync"]})
    out = ctl(daemon, "policy", "show").stdout
    assert "diloco  H=20" in out and "int8" in out and "node-1, node-2" in out
    daemon.answers["policy.show"] = ok(None)
    assert "no sync policy yet" in ctl(daemon, "policy", "show").stdout


def test_tables_show_ids_scheduler_and_state(daemon: FakeDaemon) -> None:
    out = ctl(daemon, "nodes").stdout
    for node in NODES:
        assert str(node["id"]) in out
    star_line = next(line for line in out.splitlines() if "node-1" in line)
    assert "★" in star_line and "active" in star_line
    assert "failed" in out

    out = ctl(daemon, "status").stdout
    assert "node-1" in out and "term 4" in out and "lab" in out
    assert "active 2" in out and "failed 1" in out

    out = ctl(daemon, "events").stdout
    assert "scheduler-elected" in out and "node-failed" in out and "812 ms" in out
    assert "silent 812 ms, last will" in out  # a summary, not the raw fields

    out = ctl(daemon, "links").stdout
    assert "node-1" in out and "node-2" in out and "0.42" in out


def test_status_without_scheduler(daemon: FakeDaemon) -> None:
    daemon.answers["status"] = ok({**STATUS, "scheduler": None})
    proc = ctl(daemon, "status")
    assert proc.returncode == 0
    assert "none elected" in proc.stdout


@pytest.mark.parametrize(("code", "exit_code"), [("failed", 1), ("usage", 2), ("other", 1)])
def test_daemon_errors_map_to_exit_codes(daemon: FakeDaemon, code: str, exit_code: int) -> None:
    daemon.answers["leave"] = fail("node-2 is not part of the job", code)
    line = assert_one_line_error(ctl(daemon, "leave"), exit_code)
    assert line == "chaosctl: node-2 is not part of the job"


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        (b"this is not json\n", "not JSON"),
        (b"\xff\xfe\n", "not JSON"),
        (b"[1, 2]\n", "malformed"),
        (b'{"v": 1, "data": {}}\n', "malformed"),
        (b'{"v": 2, "ok": true, "data": {}}\n', "protocol v2"),
        (b'{"v": 1, "ok": true}\n', "no 'data'"),
        (b'{"v": 1, "ok": true, "data": "x"}\n', "not an object"),
        (None, "closed the connection"),
    ],
)
def test_garbage_answers_exit_1(daemon: FakeDaemon, answer: bytes | None, needle: str) -> None:
    daemon.answers["status"] = answer
    line = assert_one_line_error(ctl(daemon, "status"), 1)
    assert needle in line


def test_table_of_wrong_shape_exits_1(daemon: FakeDaemon) -> None:
    daemon.answers["nodes"] = ok({"id": "node-1"})
    assert "not a list" in assert_one_line_error(ctl(daemon, "nodes"), 1)


def test_silent_daemon_times_out_with_exit_3(daemon: FakeDaemon) -> None:
    daemon.hang.set()
    proc = run_ctl("--socket", str(daemon.path), "--timeout", "0.5", "status")
    assert "did not answer 'status' within 0.5s" in assert_one_line_error(proc, 3)


def interrupt(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()  # it ignored the Ctrl-C: fail, but leave no process behind
        proc.communicate(timeout=15)
        raise


def popen_ctl(daemon: FakeDaemon, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*chaosctl_argv(), "--socket", str(daemon.path), *args], env=ctl_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )


def wait_for_requests(daemon: FakeDaemon, op: str, count: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while sum(r["op"] == op for r in daemon.requests) < count:
        assert time.monotonic() < deadline, daemon.requests
        time.sleep(0.05)


def test_watch_refreshes_and_ctrl_c_exits_0(daemon: FakeDaemon) -> None:
    proc = popen_ctl(daemon, "nodes", "--watch")
    wait_for_requests(daemon, "nodes", 2)
    out, err = interrupt(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in out + err
    assert "node-3" in out


def test_watch_json_streams_one_document_per_line(daemon: FakeDaemon) -> None:
    proc = popen_ctl(daemon, "status", "--watch", "--json")
    # The third request is sent only after the second answer was printed: two documents out
    # whatever the load (the second answer alone can be cut off by the interrupt).
    wait_for_requests(daemon, "status", 3)
    out, err = interrupt(proc)
    assert proc.returncode == 0, err
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) >= 2 and all(doc == STATUS for doc in docs)


def test_events_follow_polls_since_last_seq(daemon: FakeDaemon) -> None:
    later = {"seq": 3, "ts": 1700000005.0, "kind": "scale-in", "node": "node-3", "peer": None,
             "term": 4, "delay_ms": None}

    def events(request: dict[str, Any]) -> dict[str, Any]:
        since = request["args"]["since"]
        return ok([ev for ev in [*EVENTS, later] if ev["seq"] > since])

    daemon.answers["events"] = events
    proc = popen_ctl(daemon, "events", "--follow", "--json")
    wait_for_requests(daemon, "events", 3)
    out, err = interrupt(proc)
    assert proc.returncode == 0, err
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [1, 2, 3]
    sinces = [r["args"]["since"] for r in daemon.requests if r["op"] == "events"]
    assert sinces[0] == 0 and sinces[-1] == 3


def test_ctrl_c_while_the_cli_imports_is_one_line_and_exit_130() -> None:
    # The Ctrl-C lands at the import seam: a finder that interrupts the CLI's own import.
    script = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'chaosctl.main':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from chaosctl.entry import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 130
    assert done.stderr.decode().strip() == "chaosctl: interrupted"
