"""Processes inside testbed namespaces: the broker in the hub, chaosd in every node, the redrawer.

Each one is started with ``ip netns exec`` (which execs in place, so the Popen's pid is the
program's own) in a session of its own, so a Ctrl-C in the terminal reaches chaosctl only and
chaosctl tears the testbed down in order. Nothing here outlives the namespaces: teardown kills
whatever runs in them (:mod:`chaosctl.testbed.state`).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from chaosctl.client import ControlFailure
from chaosctl.cluster import chaosd_command, mosquitto_binary
from chaosctl.testbed.state import TestbedError, TestbedState
from chaosctl.testbed.topo import HUB_ADDR
from netprobe import netns, tc

BROKER_PORT = 1883  # the hub has a port space of its own, so the standard port is always free
UNIX_PATH_MAX = 107  # sun_path is 108 bytes including the NUL


def requirements(qdisc: str = "tbf") -> list[str]:
    """What this machine lacks for a testbed (root, ip, tc, the qdisc, mosquitto, chaosd)."""
    problems = tc.missing(["tbf" if qdisc == "tbf" else "htb"])
    try:
        mosquitto_binary()
    except ControlFailure as exc:
        problems.append(str(exc))
    try:
        chaosd_command()
    except ControlFailure as exc:
        problems.append(str(exc))
    return problems


def spawn(ns: str, argv: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in namespace ``ns`` with stdout and stderr appended to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*netns.exec_prefix(ns), *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )


def broker_argv(state: TestbedState) -> list[str]:
    """Write the hub's mosquitto config and return its command line."""
    conf = Path(state.dir) / "mosquitto.conf"
    conf.write_text(f"listener {BROKER_PORT} {HUB_ADDR}\nallow_anonymous true\n"
                    "persistence false\nlog_dest stderr\n")
    return [mosquitto_binary(), "-c", str(conf)]


def broker_url() -> str:
    """The broker URL every node is given."""
    return f"mqtt://{HUB_ADDR}:{BROKER_PORT}"


def listening(pid: int, port: int) -> bool:
    """Whether process ``pid``'s network namespace has a TCP socket listening on ``port``.

    Reads ``/proc/<pid>/net/tcp`` and ``tcp6``, which show the namespace of that process, so
    chaosctl can check the hub's broker without entering the hub. Both: iperf3 listens on
    ``::`` (dual stack), which only ``tcp6`` lists, so each wait for it ran out its 5 s.
    """
    want = f":{port:04X}"
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        if any(f[1].endswith(want) and f[3] == "0A" for f in (ln.split() for ln in lines)):
            return True
    return False


def wait_broker(proc: subprocess.Popen[bytes], log: Path, timeout: float = 15.0) -> None:
    """Wait until the hub's broker listens.

    Raises:
        TestbedError: It exited or did not listen in time; the message points at its log.
    """
    deadline = time.monotonic() + timeout
    while not listening(proc.pid, BROKER_PORT):
        if proc.poll() is not None:
            raise TestbedError(f"mosquitto exited at start (code {proc.returncode}); see {log}")
        if time.monotonic() > deadline:
            raise TestbedError(f"mosquitto did not listen within {timeout:g}s; see {log}")
        time.sleep(0.05)


def node_config(state: TestbedState, node: str) -> Path:
    """Write ``node``'s chaosd.toml: the testbed's cluster secret, made once per testbed
    (``<dir>/secret``, mode 0600) so that restarted nodes sign with the same key."""
    path = Path(state.dir) / "secret"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
    conf = Path(state.dir) / f"{node}.toml"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f'secret = "{path.read_text().strip()}"\n{state.config}')
    return conf


def chaosd_argv(state: TestbedState, node: str) -> list[str]:
    """The ``chaosd`` command line of ``node``.

    Raises:
        TestbedError: The socket path is too long for a Unix socket (pick a shorter --dir).
    """
    rec = state.nodes[node]
    if len(rec.socket.encode()) > UNIX_PATH_MAX:
        raise TestbedError(f"the control socket path {rec.socket} is longer than "
                           f"{UNIX_PATH_MAX} bytes; use a shorter --dir")
    return [
        *chaosd_command(),
        "--config", str(node_config(state, node)),
        "--node-id", node,
        "--cluster", state.cluster,
        "--broker", broker_url(),
        "--socket", rec.socket,
        "--data-dir", rec.data_dir,
        "--advertise", rec.addr,
    ]


def redraw_argv(state: TestbedState) -> list[str]:
    """The redraw loop's command line (it runs in the hub, so teardown kills it with the hub)."""
    return [sys.executable, "-m", "chaosctl.testbed.redraw", state.dir]
