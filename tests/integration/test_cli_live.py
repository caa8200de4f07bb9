"""The real ``chaosctl`` console script against real daemons: the JSON contracts of DESIGN.md.

tests/cli covers the CLI against a fake socket; this checks that what real chaosd processes
answer, passed through chaosctl, has exactly the keys DESIGN.md fixes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chaosctl.cluster import LocalCluster
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.timeout(90)
MakeCluster = Callable[..., LocalCluster]
STATUS_KEYS = {"cluster", "node", "scheduler", "nodes", "step", "policy_version"}
NODE_KEYS = {"id", "state", "addr", "scheduler", "heartbeat_age_s", "step", "neighbors"}
EVENT_KEYS = {"ts", "kind", "node", "peer", "term", "delay_ms"}
LINK_KEYS = {"a", "b", "state", "rtt_ms", "bandwidth_mbps", "measured_at"}
NODE_STATES = {"standby", "joining", "active", "leaving", "failed", "left"}
EVENT_KINDS = {"scale-out", "scale-in", "connect-link", "disconnect-link", "node-failed",
               "link-failed", "scheduler-elected", "partition", "state-diverged"}


def chaosctl(sock: Path | str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    beside = Path(sys.executable).with_name("chaosctl")
    exe = str(beside) if beside.exists() else shutil.which("chaosctl")
    if not exe:
        pytest.skip("the chaosctl console script is not installed (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if k != "CHAOS_SOCKET"}
    env.update({"NO_COLOR": "1", "COLUMNS": "200", "TERM": "dumb"})
    return subprocess.run([exe, "--socket", str(sock), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def json_of(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    return json.loads(proc.stdout)


def test_read_commands_keep_the_contract(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, "embedded")
    ids = c.node_ids
    sock = c.socket_of(ids[-1])

    def settled() -> Any:
        st = c.query(ids[-1], "status")
        events = c.query(ids[-1], "events") or []
        ok = st and st["scheduler"] and st["nodes"] == {"standby": 3} and any(
            e["kind"] == "scheduler-elected" for e in events)
        return st if ok else None
    wait_until(settled, 30, "a scheduler and its event on node-3")

    status = json_of(chaosctl(sock, "status", "--json"))
    assert set(status) == STATUS_KEYS, status
    assert set(status["scheduler"]) == {"id", "term"}
    assert status["scheduler"]["id"] in ids and status["scheduler"]["term"] >= 1
    assert (status["cluster"], status["node"]) == (c.cluster, ids[-1])
    assert status["nodes"] == {"standby": 3}
    assert isinstance(status["step"], int) and isinstance(status["policy_version"], int)

    rows = json_of(chaosctl(sock, "nodes", "--json"))
    assert isinstance(rows, list) and [r["id"] for r in rows] == ids
    for row in rows:
        assert set(row) == NODE_KEYS, row
        assert row["state"] in NODE_STATES
        assert isinstance(row["scheduler"], bool) and isinstance(row["neighbors"], list)
        assert row["heartbeat_age_s"] is None or isinstance(row["heartbeat_age_s"], float)
    assert [r["id"] for r in rows if r["scheduler"]] == [status["scheduler"]["id"]]

    events = json_of(chaosctl(sock, "events", "--json"))
    assert isinstance(events, list) and events
    for ev in events:
        assert set(ev) >= EVENT_KEYS, ev
        assert ev["kind"] in EVENT_KINDS
        assert isinstance(ev["ts"], float)
    elected = [e for e in events if e["kind"] == "scheduler-elected"]
    assert elected[-1]["node"] == status["scheduler"]["id"]
    assert elected[-1]["term"] == status["scheduler"]["term"]

    links = json_of(chaosctl(sock, "links", "--json"))
    assert isinstance(links, list)
    for link in links:
        assert set(link) == LINK_KEYS, link

    table = chaosctl(sock, "nodes")
    assert table.returncode == 0 and table.stderr == "", table.stderr
    for node in ids:
        assert node in table.stdout, table.stdout
    assert "Traceback" not in table.stdout
    plain = chaosctl(sock, "status")
    assert plain.returncode == 0 and status["scheduler"]["id"] in plain.stdout


def test_unreachable_socket_exits_3() -> None:
    proc = chaosctl("/nonexistent", "status", timeout=30)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("chaosctl: ") and "/nonexistent" in lines[0], lines
    assert "Traceback" not in proc.stderr


def one_error_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("chaosctl: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_actions_reject_bad_input_with_one_line(make_cluster: MakeCluster) -> None:
    c = make_cluster(2, "mosquitto")
    node = c.node_ids[0]
    wait_until(lambda: c.agreed(c.node_ids), 20, "a scheduler")
    sock = c.socket_of(node)
    assert "not training" in one_error_line(chaosctl(sock, "leave"), 1)
    assert "itself" in one_error_line(chaosctl(sock, "link", "add", node), 2)
    assert "unknown node" in one_error_line(chaosctl(sock, "link", "add", "ghost"), 1)
    assert "own neighbor" in one_error_line(
        chaosctl(sock, "join", "--neighbor", node, "--", "true"), 2)
    # A command that cannot start leaves the daemon serving, and a later join works.
    assert c.query(node, "status")["node"] == node
