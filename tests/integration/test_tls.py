"""chaosd over TLS with username/password: a real mosquitto with a TLS listener.

The test makes its own CA and server certificate (SAN 127.0.0.1 and localhost) with the
openssl CLI, a password file with mosquitto_passwd, and runs mosquitto with
``allow_anonymous false``. chaosd processes get a TOML config with ``mqtts://`` and
``[mqtt] username/password/ca_file``; they must elect one scheduler. A chaosd with the wrong
password must never connect, stay alive and say why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chaosctl.client import ControlFailure, call_once
from chaosctl.cluster import chaosd_command, free_port, mosquitto_binary
from chaosctl.polling import agreed
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.timeout(90)
USER, PASSWORD = "chaos", "s3cret-pass"
CLUSTER = "tls"


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if not found:
        pytest.skip(f"{name} is not installed")
    return found


def _run(*argv: str, cwd: Path) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{argv[0]} failed: {proc.stderr.strip()}"


def make_pki(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost. Returns (ca, cert, key)."""
    openssl = _tool("openssl")
    _run(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=chaos test CA", cwd=d)
    _run(openssl, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
         "-out", "server.csr", "-subj", "/CN=localhost", cwd=d)
    (d / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n")
    _run(openssl, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-days", "2", "-out", "server.crt", "-extfile", "san.ext", cwd=d)
    return d / "ca.crt", d / "server.crt", d / "server.key"


@dataclass
class TlsSetup:
    dir: Path
    port: int
    ca: Path
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def spawn(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        log = self.dir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=self.dir,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                    start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def sock(self, node: str) -> Path:
        return self.dir / f"{node}.sock"

    def start_node(self, node: str, password: str = PASSWORD) -> subprocess.Popen[bytes]:
        conf = self.dir / f"{node}.toml"
        conf.write_text(
            f'node_id = "{node}"\n'
            f'cluster = "{CLUSTER}"\n'
            'secret = "tls-test-cluster-secret"\n'
            f'broker = "mqtts://127.0.0.1:{self.port}"\n'
            f'data_dir = "{self.dir / node}"\n'
            "[mqtt]\n"
            f'username = "{USER}"\n'
            f'password = "{password}"\n'
            f'ca_file = "{self.ca}"\n')
        argv = [*chaosd_command(), "--config", str(conf), "--socket", str(self.sock(node))]
        return self.spawn(argv, node)

    def query(self, node: str, op: str) -> Any:
        try:
            return call_once(self.sock(node), op, timeout=1.0)
        except ControlFailure:
            return None

    def log_of(self, name: str) -> str:
        return next(log for n, _p, log in self.procs if n == name).read_text(errors="replace")

    def close(self) -> None:
        # Nodes first (they leave through the broker), then the broker.
        for _name, proc, _log in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


@pytest.fixture
def tls() -> Iterator[TlsSetup]:
    mosquitto = (shutil.which("mosquitto")
                 or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin"))
    if not mosquitto:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    passwd_tool = _tool("mosquitto_passwd")
    # Unix socket paths must stay under 108 bytes: a short private directory.
    d = Path(tempfile.mkdtemp(prefix="chaos-tls-"))
    setup: TlsSetup | None = None
    try:
        ca, cert, key = make_pki(d)
        _run(passwd_tool, "-b", "-c", str(d / "passwd"), USER, PASSWORD, cwd=d)
        port = free_port()
        conf = d / "mosquitto.conf"
        conf.write_text(
            # Root would otherwise drop to the 'mosquitto' user, which cannot read this dir.
            "user root\n"
            "per_listener_settings false\n"
            "allow_anonymous false\n"
            f"password_file {d / 'passwd'}\n"
            "persistence false\n"
            "log_dest stderr\n"
            f"listener {port} 127.0.0.1\n"
            f"cafile {ca}\ncertfile {cert}\nkeyfile {key}\n"
            "require_certificate false\n")
        setup = TlsSetup(d, port, ca)
        broker = setup.spawn([mosquitto_binary(), "-c", str(conf)], "broker")

        def listening() -> bool:
            assert broker.poll() is None, f"mosquitto exited: {setup.log_of('broker')}"
            return _port_open(port)
        wait_until(listening, 15, "mosquitto's TLS listener")
        yield setup
    finally:
        if setup is not None:
            setup.close()
        shutil.rmtree(d, ignore_errors=True)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _agreed(t: TlsSetup, nodes: list[str]) -> tuple[str, int] | None:
    return agreed(t.query, nodes, {"standby": len(nodes)})


def test_tls_with_password_elects_one_scheduler(tls: TlsSetup) -> None:
    nodes = ["tls-a", "tls-b"]
    procs = [tls.start_node(n) for n in nodes]
    sched, term = wait_until(lambda: _agreed(tls, nodes), 30, "one scheduler over TLS")
    assert sched in nodes and term >= 1
    for node, proc in zip(nodes, procs, strict=True):
        assert proc.poll() is None, tls.log_of(node)
        info = tls.query(node, "ping")
        assert info["connected"] is True
        assert f"connected to broker mqtts://127.0.0.1:{tls.port}" in tls.log_of(node)
        assert PASSWORD not in tls.log_of(node), "the password leaked into the log"
    rows = tls.query(nodes[0], "nodes")
    assert [r["id"] for r in rows] == nodes


def _start_intruder(tls: TlsSetup) -> tuple[str, subprocess.Popen[bytes]]:
    node = "tls-bad"
    proc = tls.start_node(node, password="wrong-password")
    wait_until(lambda: tls.query(node, "ping"), 15, "the wrong-password chaosd's socket")
    return node, proc


def test_wrong_password_never_connects(tls: TlsSetup) -> None:
    good = "tls-a"
    tls.start_node(good)
    wait_until(lambda: (tls.query(good, "ping") or {}).get("connected"), 20, "a good node")
    node, proc = _start_intruder(tls)
    # Several reconnect attempts (backoff 0.2 s doubling): never connected, never gone.
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        info = tls.query(node, "ping")
        assert info is not None and info["connected"] is False, info
        assert proc.poll() is None, f"chaosd exited: {tls.log_of(node)}"
        time.sleep(0.2)
    assert tls.query(node, "status")["node"] == node
    # The rejected node never shows up in the good node's view.
    assert [r["id"] for r in tls.query(good, "nodes")] == [good]
    assert "Traceback" not in tls.log_of(node)
    # The broker refused it for the reason we think.
    assert "not authorised" in tls.log_of("broker").lower() or \
        "bad username or password" in tls.log_of("broker").lower(), tls.log_of("broker")


def test_wrong_password_logs_a_clear_line(tls: TlsSetup) -> None:
    node, proc = _start_intruder(tls)
    deadline = time.monotonic() + 8.0
    while time.monotonic() < deadline:
        text = tls.log_of(node).lower()
        if any(w in text for w in ("authori", "password", "refused")):
            break
        time.sleep(0.3)
    assert proc.poll() is None
    text = tls.log_of(node)
    assert any(w in text.lower() for w in ("authori", "password", "refused")), (
        f"no line says why the broker refused this node; its log:\n{text}")
