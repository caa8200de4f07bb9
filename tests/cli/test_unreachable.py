"""chaosctl without a daemon: exit 3 and one line on stderr, never a traceback.

The tables run ``chaosctl.main.run`` in this process (``run_ctl_here``); the rest run the
console script."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.cli.conftest import assert_one_line_error, run_ctl, run_ctl_here

pytestmark = pytest.mark.timeout(120)

COMMANDS = [
    ["status"], ["status", "--json"], ["nodes"], ["nodes", "--watch"], ["links"],
    ["events"], ["events", "--follow"], ["join"], ["leave"], ["link", "add", "node-2"],
    ["link", "del", "node-2"], ["probe", "node-2"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_missing_socket_exits_3(sock_dir: Path, args: list[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = sock_dir / "none.sock"
    line = assert_one_line_error(
        run_ctl_here("--socket", str(path), *args, monkeypatch=monkeypatch), 3)
    assert line == (
        f"chaosctl: cannot reach chaosd at {path} (is it running? start it with 'chaosd' "
        "or 'systemctl start chaosd')"
    )


def test_env_var_names_the_socket(sock_dir: Path) -> None:
    path = sock_dir / "from-env.sock"
    line = assert_one_line_error(run_ctl("status", socket_path=path), 3)
    assert str(path) in line


def test_stale_socket_file_exits_3(sock_dir: Path) -> None:
    # A socket file left behind by a crashed daemon: connect() is refused.
    path = sock_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
    line = assert_one_line_error(run_ctl("--socket", str(path), "nodes"), 3)
    assert "cannot reach chaosd" in line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nodes", "--bogus"], "No such option"),
        (["statsu"], "No such command"),
        (["probe"], "Missing argument"),
        (["events", "--limit", "0"], "--limit"),
        (["probe", "bad id!"], "invalid node id"),
        (["link", "add", "x" * 65], "invalid node id"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], needle: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    line = assert_one_line_error(run_ctl_here(*args, monkeypatch=monkeypatch), 2)
    assert needle in line


def test_groups_have_help() -> None:
    proc = run_ctl("testbed", "--help")
    assert proc.returncode == 0
    assert "namespace" in proc.stdout and "cut" in proc.stdout
    assert run_ctl("testbed").returncode == 2  # a bare group prints its help, as `link` does


def test_bench_usage_errors() -> None:
    assert "control" in run_ctl("bench", "--help").stdout
    assert "between 3 and 64" in assert_one_line_error(
        run_ctl("bench", "control", "--sizes", "2"), 2)
    assert "mosquitto or embedded" in assert_one_line_error(
        run_ctl("bench", "control", "--broker", "nats"), 2)
