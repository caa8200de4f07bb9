"""``chaosctl cluster init`` end to end: its files run a real, secure cluster that trains.

One deployment for the module: ``cluster init --in-place`` writes a CA, certificates, a TLS
mosquitto config with a password file and an ACL, and a chaosd.toml per node. mosquitto starts
from that config and three chaosd start from their own files; they elect a scheduler and train.
Then three intruders try to change something, and nothing changes:

* a client without a certificate from the cluster's CA: the broker refuses the TLS session
  (mutual TLS, with the client certificates that ``cluster init`` issues and chaosd presents);
* an anonymous client, and one with a node's username but another node's password, each with a
  valid certificate: the broker refuses the login;
* a client with a node's real credentials publishing as another node: the ACL drops it (the
  retained copy stays the real one and no daemon ever sees the message);
* a client with a node's real credentials but no secret claiming the scheduler and commanding
  a node at a higher term: the ACL lets a node do that, so message signing must stop it (the
  daemons count the forgeries as authentication failures).

The deployment names a fourth node, ``n4``, that never starts: its credentials are the stolen
ones. Using a running node's would kick that node off the broker (the client id is the
username), which is a disturbance of its own and not the one under test.
"""

from __future__ import annotations

import socket
import ssl
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from chaosctl.cluster import Child, LocalCluster, chaosd_command, free_port, mosquitto_binary
from chaosctl.main import run as chaosctl
from daemon.contracts.config import load_config
from daemon.contracts.errors import ConfigError
from daemon.contracts.messages import Command, Heartbeat, LeaderClaim, Status, Topics, encode
from tests.integration.conftest import need_mosquitto
from tests.training._run import Run

CLUSTER = "sec"
NODES = ["n1", "n2", "n3"]
SPARE = "n4"  # in the deployment, never started
# One process runs the module, so its tests share one deployed cluster.
pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("cluster_init")]


@dataclass
class Deployed(LocalCluster):
    """A LocalCluster whose broker and nodes run from ``cluster init``'s files, unchanged."""

    deploy: Path = field(default_factory=Path)
    names: list[str] = field(default_factory=list)

    @property
    def node_ids(self) -> list[str]:
        return list(self.names)

    def node_argv(self, node_id: str) -> list[str]:
        # The socket and data dir are per-run places; everything else comes from the file.
        return [*chaosd_command(), "--config", str(self.deploy / "nodes" / node_id / "chaosd.toml"),
                "--socket", str(self.socket_of(node_id)),
                "--data-dir", str(self.workdir / node_id)]

    def start_broker(self, timeout: float = 20.0) -> int:
        conf = self.deploy / "broker" / "mosquitto.conf"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.broker = Child("broker", [mosquitto_binary(), "-c", str(conf)],
                            self.workdir / "broker.log")
        self._spawn(self.broker)
        self.wait(lambda: self._ready(), timeout, "mosquitto's TLS listener")
        return self.port

    def _ready(self) -> bool:
        assert self.broker is not None
        assert self.broker.alive(), (self.workdir / "broker.log").read_text()
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def password(self, node: str) -> str:
        return str(load_config(self.deploy / "nodes" / node / "chaosd.toml").mqtt.password)

    def counters(self) -> dict[str, dict[str, int]]:
        return {n: dict((self.query(n, "ping") or {}).get("counters") or {}) for n in NODES}


@dataclass
class Intruder:
    """A plain MQTT client over the deployment's TLS listener."""

    client: mqtt.Client
    reason: Any
    got: list[tuple[str, bytes, bool]]

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(5)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def intrude(d: Deployed, user: str | None, password: str | None,
            cert: str | None = SPARE) -> Intruder:
    """Connect as ``user`` with ``password``, presenting node ``cert``'s client certificate
    (the stolen spare's by default; None: no certificate)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"intruder-{time.time()}")
    files = d.deploy / "nodes" / (cert or SPARE)
    client.tls_set(ca_certs=str(d.deploy / "ca" / "ca.crt"),
                   certfile=str(files / "client.crt") if cert else None,
                   keyfile=str(files / "client.key") if cert else None)
    if user is not None:
        client.username_pw_set(user, password)
    done: dict[str, Any] = {}
    got: list[tuple[str, bytes, bool]] = []
    client.on_connect = lambda _c, _u, _f, reason, _p: done.setdefault("reason", reason)
    client.on_message = lambda _c, _u, m: got.append((m.topic, bytes(m.payload), m.retain))
    client.connect("127.0.0.1", d.port)
    client.loop_start()
    d.wait(lambda: "reason" in done, 10, "the broker's answer to CONNECT")
    return Intruder(client, done["reason"], got)


def refused_without_certificate(d: Deployed) -> bool:
    """True if the broker ends the session of a client that has the right login but no
    certificate, before any CONNACK (in the handshake, or right after it under TLS 1.3)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"nocert-{time.time()}")
    client.tls_set(ca_certs=str(d.deploy / "ca" / "ca.crt"))
    client.username_pw_set(SPARE, d.password(SPARE))
    answered: list[Any] = []
    client.on_connect = lambda _c, _u, _f, reason, _p: answered.append(reason)
    try:
        client.connect("127.0.0.1", d.port)
    except (ssl.SSLError, OSError):
        return True
    client.loop_start()
    try:
        time.sleep(2.0)
        return not answered and not client.is_connected()
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Deployed, Run]]:
    need_mosquitto("mosquitto")
    base = tmp_path_factory.mktemp("ci")
    port = free_port()
    rc = chaosctl(["cluster", "init", str(base / "deploy"), "--nodes", ",".join([*NODES, SPARE]),
                   "--broker-host", "127.0.0.1", "--broker-port", str(port),
                   "--cluster", CLUSTER, "--in-place"])
    assert rc == 0
    d = Deployed(base / "run", len(NODES), cluster=CLUSTER, port=port, broker_kind="mosquitto",
                 deploy=base / "deploy", names=NODES)
    try:
        d.start()
        yield d, Run(d, base)
    finally:
        d.close(grace=3.0)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files(deployed: tuple[Deployed, Run]) -> None:
    d, _ = deployed
    deploy = d.deploy
    secret = (deploy / "secret").read_text().strip()
    assert len(secret) == 64 and int(secret, 16) >= 0
    for private in ("secret", "ca/ca.key", "broker/broker.key", "broker/passwd",
                    "nodes/n1/chaosd.toml", "nodes/n1/client.key"):
        assert _mode(deploy / private) == 0o600, private
    ca = x509.load_pem_x509_certificate((deploy / "ca" / "ca.crt").read_bytes())
    broker = x509.load_pem_x509_certificate((deploy / "broker" / "broker.crt").read_bytes())
    broker.verify_directly_issued_by(ca)
    sans = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    cfg = load_config(deploy / "nodes" / "n2" / "chaosd.toml")
    assert (cfg.node_id, cfg.cluster, cfg.secret) == ("n2", CLUSTER, secret)
    assert cfg.broker == f"mqtts://127.0.0.1:{d.port}" and cfg.mqtt.username == "n2"
    assert len(set(d.password(n) for n in [*NODES, SPARE])) == 4
    conf = (deploy / "broker" / "mosquitto.conf").read_text()
    assert "allow_anonymous false" in conf and "require_certificate true" in conf
    # Each node presents its own client certificate (mutual TLS), issued by the CA.
    client = x509.load_pem_x509_certificate((deploy / "nodes" / "n2" / "client.crt").read_bytes())
    client.verify_directly_issued_by(ca)
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert Path(cfg.mqtt.cert_file) == (deploy / "nodes" / "n2" / "client.crt").resolve()
    assert Path(cfg.mqtt.key_file) == (deploy / "nodes" / "n2" / "client.key").resolve()
    # A key that is not the certificate's stops chaosd at start-up, in one line naming the keys.
    text = (deploy / "nodes" / "n2" / "chaosd.toml").read_text()
    wrong = deploy / "wrong-key.toml"
    wrong.write_text(text.replace(cfg.mqtt.key_file, str(deploy / "nodes" / "n3" / "client.key")))
    with pytest.raises(ConfigError, match=r"mqtt\.cert_file/key_file cannot be loaded"):
        load_config(wrong)
    wrong.unlink()
    # A second init into the same directory is refused: one line, usage error.
    assert chaosctl(["cluster", "init", str(deploy), "--nodes", "n1"]) == 2


@pytest.fixture(scope="module")
def training(deployed: tuple[Deployed, Run]) -> tuple[Deployed, Run]:
    """The secure cluster with a worker on every node: each attack test needs it, and under
    xdist a test may be the first of its module that its process runs."""
    d, r = deployed
    sched, term = d.wait(lambda: d.agreed(NODES, {"standby": 3}), 40, "one scheduler over TLS")
    assert sched in NODES and term >= 1
    for node in NODES:
        r.join(node)
    # Three joins at once: the first is told to bootstrap, the others copy from it. (This
    # hung when the first node inferred its bootstrap from a policy naming it alone, and the
    # newest one already named the other two.)
    d.wait(lambda: r.active(NODES), 90, "every node active")
    return d, r


@pytest.mark.timeout(300)
def test_secure_cluster_trains(training: tuple[Deployed, Run]) -> None:
    _, r = training
    r.advance(NODES, 5, timeout=90)
    r.assert_consistent()


def _baseline(d: Deployed) -> tuple[tuple[str, int], dict[str, dict[str, int]]]:
    agreed = d.wait(lambda: d.agreed(NODES, {"active": 3}), 20, "a settled, training cluster")
    return agreed, d.counters()


def _unchanged(d: Deployed, r: Run, agreed: tuple[str, int]) -> None:
    time.sleep(3.0)  # several heartbeat periods: long enough for a forged message to act
    assert d.agreed(NODES, {"active": 3}) == agreed
    r.advance(NODES, 3, timeout=60)


def test_anonymous_and_wrong_password_are_refused(training: tuple[Deployed, Run]) -> None:
    d, r = training
    agreed, _ = _baseline(d)
    assert refused_without_certificate(d)
    for user, password in ((None, None), ("n1", d.password(SPARE))):
        intruder = intrude(d, user, password)
        try:
            assert intruder.reason.is_failure, (user, intruder.reason)
            assert not intruder.client.is_connected()
        finally:
            intruder.close()
    _unchanged(d, r, agreed)


def test_another_nodes_password_cannot_speak_for_n1(training: tuple[Deployed, Run]) -> None:
    d, r = training
    agreed, counters = _baseline(d)
    t = Topics(CLUSTER)
    forged_status = encode(Status(node="n1", online=False, reason="left", incarnation=1 << 40,
                                  ts=time.time() + 3600))
    forged_hb = encode(Heartbeat(node="n1", seq=1 << 40, incarnation=1 << 40, step=0,
                                 state="leaving", cpu_percent=0.0, mem_percent=0.0))
    intruder = intrude(d, SPARE, d.password(SPARE))
    try:
        assert not intruder.reason.is_failure
        intruder.publish(t.status("n1"), forged_status, retain=True)
        intruder.publish(t.hb("n1"), forged_hb)
        # The broker kept n1's own retained status: the forged one was dropped, not stored.
        intruder.client.subscribe(t.status("n1"), qos=1)
        d.wait(lambda: intruder.got, 10, "n1's retained status")
        topic, payload, retained = intruder.got[0]
        assert (topic, retained) == (t.status("n1"), True)
        assert payload != forged_status and b'"online":true' in payload
    finally:
        intruder.close()
    _unchanged(d, r, agreed)
    # No daemon even saw a message it had to reject: the broker dropped them.
    after = d.counters()
    for node in NODES:
        for key in ("rejected", "auth_failed"):
            assert after[node].get(key, 0) == counters[node].get(key, 0), (node, key)


def test_right_password_without_secret_cannot_move_the_scheduler(
        training: tuple[Deployed, Run]) -> None:
    d, r = training
    (sched, term), _ = _baseline(d)
    victim = next(n for n in NODES if n != sched)
    t = Topics(CLUSTER)
    intruder = intrude(d, SPARE, d.password(SPARE))
    try:
        assert not intruder.reason.is_failure
        # The attack: a retained claim for a live node at a far higher term, then a
        # command at that term. The ACL lets a node's credentials publish both.
        intruder.publish(t.leader, encode(LeaderClaim(id=victim, term=999, ts=time.time())),
                         retain=True)
        intruder.publish(t.cmd(victim), encode(Command(term=999, leader=victim, seq=1,
                                                       op="disconnect",
                                                       args={"peer": sched})))
    finally:
        intruder.close()
    _unchanged(d, r, (sched, term))
    assert sum(c.get("auth_failed", 0) for c in d.counters().values()) > 0
