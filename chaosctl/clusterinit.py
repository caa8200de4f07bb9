"""``chaosctl cluster init DIR``: every file a secure deployment needs, written in one go.

The layout under DIR (``*`` marks files created mode 0600)::

    secret*                      the cluster secret: 32 random bytes, hex
    ca/ca.crt ca/ca.key*         the cluster's CA; keep the key offline, it signs new certificates
    broker/mosquitto.conf        TLS listener, no anonymous access, password file and ACL
    broker/{ca.crt,broker.crt,broker.key*,passwd*,acl}
    nodes/<id>/chaosd.toml*      node_id, cluster, mqtts:// broker, username/password, CA,
                                 client certificate and key, secret
    nodes/<id>/{ca.crt,client.crt,client.key*}

The configs name the files at their install paths (/etc/mosquitto/chaos, /etc/chaos), or, with
``--in-place``, where they were written, to try the cluster on this box.

The ACL binds each node's username to its id. A node may publish its own heartbeat and status
only, so nobody holding another node's password can speak for it; every node may publish the
scheduler's topics (``sched/*``, ``node/+/cmd``, ``cluster/state``), because any node may be
elected. Inside that circle, signed control messages keep a node that lacks the secret from
claiming power. Every authenticated user may read the cluster's topics; anonymous clients
cannot connect at all.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import ipaddress
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.panel import Panel
from rich.table import Table

from chaosctl.client import CtlUsageError
from chaosctl.common import console
from daemon.contracts.config import NAME_RE
from daemon.contracts.messages import Topics

NODE_DIR = "/etc/chaos"
BROKER_DIR = "/etc/mosquitto/chaos"
# mosquitto_passwd's own default; the passwords are random tokens, so the work factor matters
# less than the broker's CPU on every connect.
PBKDF2_ITERATIONS = 101
HOST_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9-]{1,63})*$")

cluster_app = typer.Typer(
    name="cluster",
    help="Set up a cluster: certificates, broker and node configs, secrets.",
    no_args_is_help=True,
)


@dataclass(frozen=True)
class NodeSpec:
    """One node: its id and, optionally, the address its peers reach it at."""

    id: str
    advertise: str = ""


@dataclass(frozen=True)
class Plan:
    """What ``init`` writes and where the configs say the files live."""

    out: Path
    cluster: str
    nodes: list[NodeSpec]
    hosts: list[str]
    port: int
    in_place: bool = False

    @property
    def broker_url(self) -> str:
        host = self.hosts[0]
        if ":" in host:  # an IPv6 address goes in brackets in a URL
            host = f"[{host}]"
        return f"mqtts://{host}:{self.port}"

    def broker_path(self, name: str) -> str:
        base = (self.out / "broker").resolve() if self.in_place else Path(BROKER_DIR)
        return str(base / name)

    def node_path(self, node: str, name: str) -> str:
        base = (self.out / "nodes" / node).resolve() if self.in_place else Path(NODE_DIR)
        return str(base / name)


def check_host(host: str) -> str:
    """``host`` if it is an IP address or a DNS name, else a usage error."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        if HOST_RE.match(host):
            return host
    raise CtlUsageError(f"--broker-host {host!r} is neither an IP address nor a DNS name")


def parse_nodes(text: str) -> list[NodeSpec]:
    """``n1,n2=10.0.0.2,...``: node ids (chaosd's NAME_RE), each with an optional address."""
    specs: list[NodeSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        node, _, addr = item.partition("=")
        if not NAME_RE.match(node):
            raise CtlUsageError(f"--nodes: {node!r} is not a node id "
                                "(1-64 of A-Z a-z 0-9 _ . -)")
        if addr:
            try:
                addr = str(ipaddress.ip_address(addr))
            except ValueError:
                raise CtlUsageError(f"--nodes: {addr!r} (for {node}) is not an IP address") \
                    from None
        specs.append(NodeSpec(node, addr))
    ids = [s.id for s in specs]
    if not ids:
        raise CtlUsageError("--nodes: name at least one node")
    if len(set(ids)) != len(ids):
        raise CtlUsageError("--nodes: a node is named twice")
    return specs


def password_hash(password: str, salt: bytes | None = None,
                  iterations: int = PBKDF2_ITERATIONS) -> str:
    """A mosquitto 2 password-file hash: ``$7$ITER$SALT$HASH``, PBKDF2-SHA512, base64."""
    salt = salt if salt is not None else secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    return (f"$7${iterations}${base64.b64encode(salt).decode()}$"
            f"{base64.b64encode(digest).decode()}")


def acl_text(cluster: str, nodes: list[str]) -> str:
    """The broker's ACL: per-user blocks, nothing for anonymous (see the module docstring)."""
    t = Topics(cluster)
    lines = [f"# mosquitto ACL of chaos cluster {cluster!r}; written by chaosctl cluster init.",
             "# Each node publishes only its own heartbeat and status. The scheduler's topics",
             "# are open to every node, since any node may be elected; signed messages guard",
             "# them. No line before the first 'user': anonymous clients get nothing.", ""]
    for node in nodes:
        lines += [f"user {node}",
                  f"topic read {t.root}/#",
                  f"topic write {t.hb(node)}",
                  f"topic write {t.status(node)}",
                  f"topic write {t.cmd('+')}",
                  f"topic write {t.leader}",
                  f"topic write {t.req}",
                  f"topic write {t.state}",
                  ""]
    return "\n".join(lines)


def mosquitto_conf(plan: Plan) -> str:
    """The broker's config: one TLS listener; usable alone (``mosquitto -c``) or from conf.d."""
    p = plan.broker_path
    # Started as root, mosquitto becomes user 'mosquitto' before it reads the password file;
    # a trial here must keep the rights of whoever wrote the 0600 files (ignored if not root).
    user = [f"user {getpass.getuser()}"] if plan.in_place else []
    return "\n".join([
        f"# mosquitto for chaos cluster {plan.cluster!r}; written by chaosctl cluster init.",
        f"# Run alone: mosquitto -c {p('mosquitto.conf')}",
        "# or put it in /etc/mosquitto/conf.d/ for the packaged service.",
        *user,
        f"listener {plan.port}",
        f"cafile {p('ca.crt')}",
        f"certfile {p('broker.crt')}",
        f"keyfile {p('broker.key')}",
        "# Mutual TLS: a client must present a certificate from the cluster's CA (each node's",
        "# is in nodes/<id>/), and then log in with its password, which the ACL binds to its id.",
        "require_certificate true",
        "# The session's client id is the username: no one can take over another node's session.",
        "use_username_as_clientid true",
        "allow_anonymous false",
        f"password_file {p('passwd')}",
        f"acl_file {p('acl')}",
        "",
    ])


def _q(value: str) -> str:
    """A TOML basic string (JSON's escapes are valid TOML)."""
    return json.dumps(value)


def node_toml(plan: Plan, node: NodeSpec, password: str, secret: str) -> str:
    """chaosd.toml for ``node``: the fields of daemon.contracts.config that the cluster needs."""
    advertise = (f"advertise = {_q(node.advertise)}" if node.advertise else
                 '# advertise = "ADDRESS"  # where peers reach this box (default 127.0.0.1)')
    return "\n".join([
        f"# chaosd of node {node.id!r} in cluster {plan.cluster!r}; written by chaosctl "
        "cluster init.",
        f"# Install as {NODE_DIR}/chaosd.toml, mode 0600: it holds a password and the secret.",
        f"node_id = {_q(node.id)}",
        f"cluster = {_q(plan.cluster)}",
        f"broker = {_q(plan.broker_url)}",
        advertise,
        f"secret = {_q(secret)}",
        "",
        "[mqtt]",
        f"username = {_q(node.id)}",
        f"password = {_q(password)}",
        f"ca_file = {_q(plan.node_path(node.id, 'ca.crt'))}",
        f"cert_file = {_q(plan.node_path(node.id, 'client.crt'))}",
        f"key_file = {_q(plan.node_path(node.id, 'client.key'))}",
        "",
    ])


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse a file, or a non-empty directory without ``force``."""
    if out.exists() and not out.is_dir():
        raise CtlUsageError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise CtlUsageError(f"{out} is not empty; pass --force to overwrite its files")


def write_all(plan: Plan) -> list[tuple[Path, str]]:
    """Write every file; return (path, what it is) in the order written."""
    from chaosctl import pki  # here: cryptography would slow every other chaosctl command

    written: list[tuple[Path, str]] = []

    def put(rel: str, data: str | bytes, what: str, private: bool = False) -> None:
        path = plan.out / rel
        pki.write_file(path, data.encode() if isinstance(data, str) else data, private)
        written.append((path, what))

    secret = secrets.token_hex(32)
    put("secret", secret + "\n", "cluster secret", private=True)
    ca = pki.make_ca(plan.cluster)
    put("ca/ca.crt", ca.cert_pem, "CA certificate")
    put("ca/ca.key", ca.key_pem, "CA key: keep offline", private=True)
    broker = pki.issue(ca, plan.cluster, plan.hosts[0], server_hosts=plan.hosts)
    put("broker/ca.crt", ca.cert_pem, "CA certificate")
    put("broker/broker.crt", broker.cert_pem, f"broker certificate ({', '.join(plan.hosts)})")
    put("broker/broker.key", broker.key_pem, "broker key", private=True)
    passwords = {n.id: secrets.token_urlsafe(24) for n in plan.nodes}
    put("broker/passwd", "".join(f"{n}:{password_hash(pw)}\n" for n, pw in passwords.items()),
        "broker password file (PBKDF2-SHA512)", private=True)
    put("broker/acl", acl_text(plan.cluster, list(passwords)), "broker ACL")
    put("broker/mosquitto.conf", mosquitto_conf(plan), "mosquitto config")
    for node in plan.nodes:
        d = f"nodes/{node.id}"
        client = pki.issue(ca, plan.cluster, node.id)
        put(f"{d}/chaosd.toml", node_toml(plan, node, passwords[node.id], secret),
            "chaosd config", private=True)
        put(f"{d}/ca.crt", ca.cert_pem, "CA certificate")
        put(f"{d}/client.crt", client.cert_pem, "client certificate")
        put(f"{d}/client.key", client.key_pem, "client key", private=True)
    return written


def next_steps(plan: Plan) -> list[str]:
    """The commands that take the files to a running cluster."""
    out = plan.out
    if plan.in_place:
        return [f"mosquitto -c {plan.broker_path('mosquitto.conf')}",
                *(f"chaosd --config {plan.node_path(n.id, 'chaosd.toml')} "
                  f"--socket /tmp/chaos-{n.id}.sock --data-dir /tmp/chaos-{n.id}"
                  for n in plan.nodes)]
    return [
        f"# on the broker host ({plan.hosts[0]}):",
        f"sudo install -d -m 0750 -g mosquitto {BROKER_DIR}",
        f"sudo install -m 0640 -g mosquitto {out}/broker/* {BROKER_DIR}/",
        f"sudo ln -sf {BROKER_DIR}/mosquitto.conf /etc/mosquitto/conf.d/chaos.conf",
        "sudo systemctl restart mosquitto   # or: "
        f"sudo mosquitto -c {BROKER_DIR}/mosquitto.conf",
        "# on each node N, with chaosd installed (see README):",
        f"sudo install -d -m 0700 {NODE_DIR}",
        f"sudo install -m 0600 {out}/nodes/N/* {NODE_DIR}/   # chaosd.toml, ca.crt, client.*",
        "sudo systemctl enable --now chaosd",
        "chaosctl status",
    ]


def _summary(plan: Plan, written: list[tuple[Path, str]]) -> None:
    table = Table(title=f"cluster {plan.cluster!r}: {len(plan.nodes)} nodes, broker "
                        f"{plan.broker_url}", title_justify="left")
    for col in ("FILE", "MODE", "WHAT"):
        table.add_column(col)
    for path, what in written:
        table.add_row(str(path.relative_to(plan.out)), oct(path.stat().st_mode & 0o777)[2:],
                      what)
    console.print(table)
    console.print(Panel("\n".join(next_steps(plan)), title="next", title_align="left",
                        expand=False))


@cluster_app.command("init")
def init(
    out: Annotated[Path, typer.Argument(metavar="DIR", help="Where to write the files.")],
    nodes: Annotated[str, typer.Option(
        "--nodes", metavar="ID[=ADDR],...",
        help="The nodes, comma-separated; ADDR (optional) is the address peers reach it at.",
    )],
    broker_host: Annotated[list[str], typer.Option(
        "--broker-host", metavar="HOST",
        help="The broker's IP or DNS name, in its certificate and the nodes' URL; repeat "
             "for more names (the first goes in the URL).",
    )] = ["127.0.0.1"],  # noqa: B006 - typer reads the default, never mutates it
    broker_port: Annotated[int, typer.Option(
        "--broker-port", min=1, max=65535, metavar="PORT", help="The broker's TLS port.",
    )] = 8883,
    cluster: Annotated[str, typer.Option(
        "--cluster", metavar="NAME", help="The cluster's name.")] = "default",
    in_place: Annotated[bool, typer.Option(
        "--in-place", help="Configs name the files where they are written, not their "
                           "install paths: to try the cluster on this box.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite the files in a non-empty DIR.")] = False,
) -> None:
    """Write a cluster's secret, certificates, broker config and node configs."""
    if not NAME_RE.match(cluster):
        raise CtlUsageError(f"--cluster {cluster!r} must be 1-64 of A-Z a-z 0-9 _ . -")
    hosts = list(dict.fromkeys(check_host(h) for h in broker_host))
    plan = Plan(out, cluster, parse_nodes(nodes), hosts, broker_port, in_place)
    check_out_dir(out, force)
    _summary(plan, write_all(plan))
