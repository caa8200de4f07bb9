"""chaosd configuration: one typed, frozen config, checked once at start-up.

Precedence (lowest first): built-in defaults, the TOML file, command-line flags. Any unknown
key or bad value raises :class:`ConfigError` naming the key, and chaosd stops with that line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import socket
import ssl
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from daemon.contracts.control import DEFAULT_SOCKET
from daemon.contracts.errors import ConfigError
from daemon.contracts.policy import (
    MAX_FRAGMENTS,
    MAX_INNER_STEPS,
    OUTER_OPTIMIZERS,
    POLICY_PARTS,
    SYNC_MODES,
    WIRE_FORMATS,
    WIRE_RANK,
    SyncMode,
)
from daemon.contracts.signing import control_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 boxes
    import tomli as tomllib

DEFAULT_CONFIG = Path("/etc/chaos/chaosd.toml")
DEFAULT_DATA_DIR = "/var/lib/chaos"
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
LogLevel = Literal["debug", "info", "warning", "error"]
# Below this, a poll that a loaded box delays would read as a hang (workers poll every 50 ms).
MIN_POLL_SILENCE_S = 1.0


@dataclass(frozen=True)
class MqttConfig:
    username: str = ""
    password: str = ""
    ca_file: str = ""
    # For a broker that demands client certificates (mutual TLS): this node's certificate
    # (PEM, chain allowed) and its private key; an empty key_file means the key is in cert_file.
    cert_file: str = ""
    key_file: str = ""
    tls_insecure: bool = False
    # The broker fires our last will after 1.5x keepalive of silence (MQTT 3.1.1, 3.1.2.10).
    keepalive_s: int = 3
    embedded_bind: str = "127.0.0.1"
    embedded_port: int = 1883
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 5.0


@dataclass(frozen=True)
class DetectorConfig:
    """Phi-accrual on heartbeats. Defaults: Akka's threshold 8, a tighter LAN pause.

    With 0.5 s heartbeats, a 1 s acceptable pause and a 0.1 s floor on the deviation, a silent
    node crosses phi=8 about 2.1 s after its last heartbeat, whatever the cluster's size: each
    node's history is judged on its own.
    """

    heartbeat_interval_s: float = 0.5
    phi_threshold: float = 8.0
    acceptable_pause_s: float = 1.0
    min_std_s: float = 0.1


@dataclass(frozen=True)
class ElectionConfig:
    # Candidates stand in id order this far apart. More than a heartbeat interval (0.5 s):
    # each node judges silence only up to its own last heartbeat's return, so two nodes judge
    # the same silence up to one interval apart, and at 0.3 s the second in line often stood
    # first (the bridge and fan-out tests). Only a second candidate waits longer.
    stagger_s: float = 0.6
    grace_s: float = 1.5
    # A node that knows a cluster existed (a term, kept in data_dir, or a live peer's presence
    # says so) but holds no snapshot of it waits this long before it stands and starts afresh:
    # longer than a peer that holds the state needs to reconnect and stand. A reconnected
    # node forgives its old scheduler's silence for 2 * mqtt.reconnect_max_s + grace_s (11.5 s
    # by default), then detects it (~2 s): 10 s let a newcomer win that race (the simulator).
    orphan_s: float = 20.0
    # A scheduler that hears a better claim while more nodes train under it than under the
    # claimant (a healed partition) counts this long before it outbids or yields; its
    # followers hold on to it for twice this. 0 turns the contest off (newest term wins).
    contest_s: float = 1.0


@dataclass(frozen=True)
class ProbeConfig:
    """Link monitoring (netprobe): RTT probes to overlay neighbours, bandwidth on demand and
    periodically at a low duty cycle."""

    enabled: bool = True
    rtt_interval_s: float = 1.0
    # A neighbour link is declared failed after this many missed probes in a row, i.e. within
    # rtt_interval_s * fail_after + rtt_interval_s (4 s by default).
    fail_after: int = 3
    bandwidth_period_s: float = 60.0  # 0: no background tests (on-demand ones still run)
    iperf3: str = "iperf3"
    bw_port: int = 0  # 0: pick a free port at start-up


#: Strategies a training cluster can use; the other two of DESIGN.md are bench baselines.
TRAINING_STRATEGIES = ("chaos", "single")
BENCH_ONLY_STRATEGIES = ("multi-source", "stop-resume")


@dataclass(frozen=True)
class ReplicationConfig:
    """Scale-out state replication. ``strategy`` is the cluster's: the elected scheduler puts
    its own in every ``replicate`` command, so give every node the same. The rest are this
    node's own limits."""

    strategy: str = "chaos"  # chaos: planned split over all neighbours; single: EDL+
    # What this node sends to one joining node, in Mbit/s; 0 leaves it uncapped. A box on a
    # thin uplink keeps room for its own all-reduce while it serves.
    serve_mbps: float = 0.0
    # A joining node measures its source links (iperf3, all at once) before planning when its
    # model holds at least this many MiB; below, probing would cost more than a bad split.
    probe_min_mib: float = 16.0
    # A source snapshots its state for a joining node only if this much memory stays free
    # after the copy; otherwise it declines, and the new node plans with the other sources.
    snapshot_reserve_mib: float = 256.0


@dataclass(frozen=True)
class TrainingConfig:
    """The cluster's training rounds. Like ``replication.strategy``, the elected scheduler
    puts its own value in every sync policy, so give every node the same."""

    # Wire format of the gradients in the all-reduce: fp32 (exact), fp16/bf16 (half the
    # bytes) or int8 (a quarter, per-block scales, error feedback). Buffers, counters and
    # speed slots always travel as fp32.
    wire: str = "fp32"
    # every-step: all-reduce the gradients of every step. diloco: each member steps its own
    # optimizer for inner_steps steps, then the members all-reduce the change of the
    # parameters and apply it with the outer optimizer (far fewer bytes on slow links).
    # streaming: diloco whose parameters are synced a fragment at a time, one fragment every
    # inner_steps / fragments steps (the same bytes, a fragments-th of the peak).
    sync: str = "every-step"
    inner_steps: int = 50  # DiLoCo's H (diloco and streaming)
    outer_optimizer: str = "nesterov"  # nesterov (SGD with Nesterov momentum) or sgd
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    fragments: int = 5  # streaming only: must divide inner_steps
    merge: float = 0.0  # streaming only: the share of its local value a member keeps
    # streaming only: a round runs while the next step computes; it lands in the next update()
    overlap: bool = False

    def sync_mode(self) -> SyncMode:
        """The sync mode the scheduler puts in every policy."""
        if self.sync == "streaming":
            return SyncMode(self.sync, self.inner_steps, self.outer_optimizer, self.outer_lr,
                            self.outer_momentum, self.fragments, self.merge, self.overlap)
        return SyncMode(self.sync, self.inner_steps if self.sync == "diloco" else 1,
                        self.outer_optimizer, self.outer_lr, self.outer_momentum)


@dataclass(frozen=True)
class AdaptiveConfig:
    """The policy controller (``daemon.cluster.controller``): off, ``[training]`` holds for the
    whole run; on, the scheduler starts from it and switches to the policy its measurements
    predict reaches the same loss soonest, within these pins and bounds."""

    enabled: bool = False
    # Parts of [training] the controller keeps as configured: sync, wire, inner_steps.
    pin: tuple[str, ...] = ()
    min_wire: str = "int8"  # never below this format (fp32 above fp16 = bf16 above int8)
    syncs: tuple[str, ...] = ("every-step", "diloco")  # the sync modes it may choose
    max_inner_steps: int = 100  # the longest DiLoCo H it may choose
    # A switch needs a predicted gain above this fraction, in ``dwell`` measurements in a row
    # (a newer link reading among them if one made it), and ``min_interval_s`` since the last
    # switch: noise does not flip the policy.
    hysteresis: float = 0.15
    dwell: int = 3
    min_interval_s: float = 60.0
    # Stragglers (daemon.cluster.stragglers): a member without which the cluster would train
    # more samples a second, by more than the hysteresis, is set aside (scale-in, its worker
    # waits to rejoin); one set aside for its links rejoins when they recover, one set aside
    # for its compute is tried again after ``straggler_retry_s``, twice as long each time it
    # is set aside again within an hour (at most 4x).
    stragglers: bool = True
    straggler_retry_s: float = 60.0


ADAPTIVE_PINS = POLICY_PARTS


@dataclass(frozen=True)
class WorkerConfig:
    """Supervision of the training worker that ``chaosctl join -- CMD`` starts."""

    # A worker polls its daemon every 20-50 ms, even inside long steps; one silent this long
    # is hung (deadlock, stuck I/O, swapping, SIGSTOP) and is killed, dropped from the rounds
    # and restarted. 0 turns the watchdog off: a hung worker then stalls every member.
    poll_silence_s: float = 4.0
    # How much nicer than chaosd the worker runs: for owners whose own programs should come
    # first. Not needed for the heartbeats: with 4 workers saturating 2 cores, chaosd's
    # heartbeat ages at the scheduler were the same at 0 and 5 (max 0.53 s both).
    nice: int = 0


@dataclass(frozen=True)
class SnapshotConfig:
    """Durable snapshots of the training state in the data dir (chaosd.toml(5)). The worker
    writes one once both ``every_steps`` steps and ``every_s`` seconds have passed since the
    last, so a power cut of every box costs at most the larger of the two; it keeps ``keep``.
    A worker that starts loads the newest one that verifies, and joins holding its step."""

    enabled: bool = True
    every_steps: int = 100
    every_s: float = 10.0
    keep: int = 3
    # Boxes besides its holder that keep a copy of the newest snapshot: while fewer than
    # ``copies + 1`` boxes hold one of the last interval (the members each hold their own),
    # the scheduler has a holder push it to boxes that do not train. 0: none.
    copies: int = 1
    port: int = 0  # TCP port of the shelf that takes those copies (0: any free one)


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics (chaosd(8), METRICS). Off by default: an address a scraper can
    reach is the operator's choice, and two daemons on one box would collide on a fixed one."""

    listen: str = ""  # host:port, e.g. "127.0.0.1:9464"; empty: no metrics server


@dataclass(frozen=True)
class Config:
    node_id: str = field(default_factory=socket.gethostname)
    cluster: str = "default"
    broker: str = "embedded"
    socket: str = DEFAULT_SOCKET
    advertise: str = "127.0.0.1"
    data_dir: str = DEFAULT_DATA_DIR
    log_level: LogLevel = "info"
    # Shared by every node of the cluster; keys the data plane's HMAC handshake and, under
    # its own derived key, every control message (docs/control-protocol.md). Required.
    secret: str = ""
    # Development only: start without a secret and neither sign nor check control messages.
    insecure: bool = False
    # How far a live control message's timestamp may be from this node's clock.
    auth_window_s: float = 60.0
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    election: ElectionConfig = field(default_factory=ElectionConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    snapshots: SnapshotConfig = field(default_factory=SnapshotConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    @property
    def data_key(self) -> bytes:
        """The data plane's HMAC key. Without a secret it derives from the cluster name,
        which keeps strangers' clusters apart but is no protection (chaosd warns)."""
        seed = self.secret or f"chaos-default-secret:{self.cluster}"
        return hashlib.sha256(seed.encode()).digest()

    @property
    def control_key(self) -> bytes | None:
        """The control plane's HMAC key, or None in ``insecure`` mode (nothing is signed)."""
        if self.insecure or not self.secret:
            return None
        return control_key(self.secret, self.cluster)

    @property
    def broker_endpoint(self) -> tuple[str, str, int]:
        """(scheme, host, port) of the broker; ``embedded`` maps to the embedded listener."""
        if self.broker == "embedded":
            return "embedded", self.mqtt.embedded_bind, self.mqtt.embedded_port
        parts = urlsplit(self.broker)
        default = 8883 if parts.scheme == "mqtts" else 1883
        return parts.scheme, parts.hostname or "", parts.port or default


_SECTIONS: dict[str, type] = {
    "mqtt": MqttConfig,
    "detector": DetectorConfig,
    "election": ElectionConfig,
    "probe": ProbeConfig,
    "replication": ReplicationConfig,
    "training": TrainingConfig,
    "adaptive": AdaptiveConfig,
    "worker": WorkerConfig,
    "snapshots": SnapshotConfig,
    "metrics": MetricsConfig,
}
# Flags the CLI may override; the names match the TOML keys.
OVERRIDABLE = ("node_id", "cluster", "broker", "socket", "advertise", "data_dir", "log_level",
               "insecure")
MIN_SECRET_CHARS = 16
NO_SECRET = ("config: no 'secret' set: every node of a cluster needs the same one (e.g. "
             "secret = \"<output of openssl rand -hex 32>\" in chaosd.toml); "
             "--insecure starts an unauthenticated development node")


def _check_type(key: str, value: Any, default: Any) -> Any:
    # bool is an int in Python; keep them apart so `keepalive_s = true` is refused.
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"config: {key} must be true or false, not {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config: {key} must be an integer, not {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config: {key} must be a number, not {value!r}")
        return float(value)
    if isinstance(default, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"config: {key} must be a list of strings, not {value!r}")
        return tuple(value)
    if not isinstance(value, str):
        raise ConfigError(f"config: {key} must be a string, not {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    defaults = cls()
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in known:
            raise ConfigError(
                f"config: unknown key '{dotted}' (known: {', '.join(sorted(known))})"
            )
        if key in _SECTIONS and not prefix:
            if not isinstance(value, dict):
                raise ConfigError(f"config: [{key}] must be a table")
            kwargs[key] = _build(_SECTIONS[key], value, f"{key}.")
        else:
            kwargs[key] = _check_type(dotted, value, getattr(defaults, key))
    return cls(**kwargs)


def _positive(key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"config: {key} must be > 0, not {value}")


def _check_client_cert(mq: MqttConfig) -> None:
    """A client certificate and key that TLS can load, or neither (checked once, here, so a
    wrong path or a key of another certificate stops chaosd in one line, not in a retry loop)."""
    if mq.key_file and not mq.cert_file:
        raise ConfigError("config: mqtt.key_file needs mqtt.cert_file (the certificate it signs)")
    if not mq.cert_file:
        return
    for key in ("cert_file", "key_file"):
        path = getattr(mq, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"config: mqtt.{key} {path!r} does not exist")
    try:
        ssl.create_default_context().load_cert_chain(mq.cert_file, mq.key_file or None)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"config: mqtt.cert_file/key_file cannot be loaded as a certificate "
                          f"and its key: {exc}") from None


def validate(cfg: Config) -> Config:
    """Check values that types alone don't catch; return ``cfg`` unchanged."""
    for key in ("node_id", "cluster"):
        if not NAME_RE.match(getattr(cfg, key)):
            raise ConfigError(
                f"config: {key} {getattr(cfg, key)!r} must be 1-64 of A-Z a-z 0-9 _ . -"
            )
    if cfg.log_level not in ("debug", "info", "warning", "error"):
        raise ConfigError(
            f"config: log_level must be debug|info|warning|error, not {cfg.log_level!r}"
        )
    if cfg.broker != "embedded":
        parts = urlsplit(cfg.broker)
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"config: broker {cfg.broker!r} has a bad port") from None
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ConfigError(
                f"config: broker must be embedded, mqtt://host:port or mqtts://host:port, "
                f"not {cfg.broker!r}"
            )
        if port is not None and not 0 < port < 65536:
            raise ConfigError(f"config: broker port {port} out of range")
    if not 0 < cfg.mqtt.embedded_port < 65536:
        raise ConfigError(f"config: mqtt.embedded_port {cfg.mqtt.embedded_port} out of range")
    if cfg.mqtt.ca_file and not Path(cfg.mqtt.ca_file).is_file():
        raise ConfigError(f"config: mqtt.ca_file {cfg.mqtt.ca_file!r} does not exist")
    _check_client_cert(cfg.mqtt)
    if not 1 <= cfg.mqtt.keepalive_s <= 3600:
        raise ConfigError(f"config: mqtt.keepalive_s must be 1..3600, not {cfg.mqtt.keepalive_s}")
    _positive("mqtt.reconnect_min_s", cfg.mqtt.reconnect_min_s)
    if cfg.mqtt.reconnect_max_s < cfg.mqtt.reconnect_min_s:
        raise ConfigError("config: mqtt.reconnect_max_s must be >= mqtt.reconnect_min_s")
    for key in ("heartbeat_interval_s", "phi_threshold", "min_std_s"):
        _positive(f"detector.{key}", getattr(cfg.detector, key))
    if cfg.detector.acceptable_pause_s < 0:
        raise ConfigError("config: detector.acceptable_pause_s must be >= 0")
    _positive("probe.rtt_interval_s", cfg.probe.rtt_interval_s)
    if not cfg.probe.bandwidth_period_s >= 0:  # also false for NaN
        raise ConfigError(f"config: probe.bandwidth_period_s must be >= 0 (0: off), not "
                          f"{cfg.probe.bandwidth_period_s:g}")
    if not 1 <= cfg.probe.fail_after <= 100:
        raise ConfigError(f"config: probe.fail_after must be 1..100, not {cfg.probe.fail_after}")
    if not 0 <= cfg.probe.bw_port < 65536:
        raise ConfigError(f"config: probe.bw_port {cfg.probe.bw_port} out of range")
    rep = cfg.replication
    if rep.strategy in BENCH_ONLY_STRATEGIES:
        raise ConfigError(f"config: replication.strategy {rep.strategy!r} is a baseline of "
                          "`chaosctl bench scaleout`, not for training; use chaos or single")
    if rep.strategy not in TRAINING_STRATEGIES:
        raise ConfigError(f"config: replication.strategy must be chaos or single, "
                          f"not {rep.strategy!r}")
    for key in ("serve_mbps", "probe_min_mib", "snapshot_reserve_mib"):
        if getattr(rep, key) < 0:
            raise ConfigError(f"config: replication.{key} must be >= 0")
    if cfg.training.wire not in WIRE_FORMATS:
        raise ConfigError(f"config: training.wire must be one of {', '.join(WIRE_FORMATS)}, "
                          f"not {cfg.training.wire!r}")
    _check_training(cfg.training)
    _check_adaptive(cfg.adaptive, cfg.training)
    silence = cfg.worker.poll_silence_s
    if silence != 0 and not MIN_POLL_SILENCE_S <= silence <= 3600:
        raise ConfigError(f"config: worker.poll_silence_s must be 0 (off) or "
                          f"{MIN_POLL_SILENCE_S:g}..3600, not {silence:g}")
    if not 0 <= cfg.worker.nice <= 19:
        raise ConfigError(f"config: worker.nice must be 0..19, not {cfg.worker.nice}")
    snaps = cfg.snapshots
    if not 1 <= snaps.every_steps <= 10**9 or not 0 <= snaps.every_s <= 86400:
        raise ConfigError("config: snapshots.every_steps must be >= 1 and snapshots.every_s "
                          f"0..86400, not {snaps.every_steps} and {snaps.every_s:g}")
    if not 1 <= snaps.keep <= 1000:
        raise ConfigError(f"config: snapshots.keep must be 1..1000, not {snaps.keep}")
    if not 0 <= snaps.copies <= 16:
        raise ConfigError(f"config: snapshots.copies must be 0..16, not {snaps.copies}")
    if not 0 <= snaps.port < 65536:
        raise ConfigError(f"config: snapshots.port must be 0 (any) or 1..65535, not "
                          f"{snaps.port}")
    listen = cfg.metrics.listen
    m_host, sep, m_port = listen.rpartition(":")
    if listen and (not sep or not m_host.strip("[]") or not m_port.isdigit()
                   or not 0 < int(m_port) < 65536):
        raise ConfigError(f"config: metrics.listen must be host:port with a port in 1..65535 "
                          f"(e.g. \"127.0.0.1:9464\"), or empty for none, not {listen!r}")
    _positive("election.stagger_s", cfg.election.stagger_s)
    _positive("election.grace_s", cfg.election.grace_s)
    _positive("election.orphan_s", cfg.election.orphan_s)
    forgive = 2 * cfg.mqtt.reconnect_max_s + cfg.election.grace_s
    if cfg.election.orphan_s <= forgive:
        raise ConfigError(f"config: election.orphan_s ({cfg.election.orphan_s:g}) must exceed "
                          f"2 * mqtt.reconnect_max_s + election.grace_s ({forgive:g}): a peer "
                          "that holds the state must get to lead first")
    if not 0 <= cfg.election.contest_s <= 60:
        raise ConfigError(f"config: election.contest_s must be 0 (off) to 60, "
                          f"not {cfg.election.contest_s:g}")
    if not cfg.socket:
        raise ConfigError("config: socket must not be empty")
    if cfg.secret and len(cfg.secret) < MIN_SECRET_CHARS:
        raise ConfigError(f"config: secret must be at least {MIN_SECRET_CHARS} characters")
    if not 1.0 <= cfg.auth_window_s <= 3600:
        raise ConfigError(f"config: auth_window_s must be 1..3600, not {cfg.auth_window_s:g}")
    return cfg


def require_secret(cfg: Config) -> Config:
    """chaosd's start-up check: a secret, or an explicit ``insecure`` development mode.

    Raises:
        ConfigError: neither is set.
    """
    if not cfg.secret and not cfg.insecure:
        raise ConfigError(NO_SECRET)
    return cfg


def _check_training(tr: TrainingConfig) -> None:
    if tr.sync not in SYNC_MODES:
        raise ConfigError(f"config: training.sync must be one of {', '.join(SYNC_MODES)}, "
                          f"not {tr.sync!r}")
    if not 1 <= tr.inner_steps <= MAX_INNER_STEPS:
        raise ConfigError(f"config: training.inner_steps must be 1..{MAX_INNER_STEPS}, "
                          f"not {tr.inner_steps}")
    if tr.outer_optimizer not in OUTER_OPTIMIZERS:
        raise ConfigError(f"config: training.outer_optimizer must be one of "
                          f"{', '.join(OUTER_OPTIMIZERS)}, not {tr.outer_optimizer!r}")
    if not 0 < tr.outer_lr <= 10:
        raise ConfigError(f"config: training.outer_lr must be in (0, 10], not {tr.outer_lr:g}")
    if not 0 <= tr.outer_momentum < 1:
        raise ConfigError(f"config: training.outer_momentum must be in [0, 1), "
                          f"not {tr.outer_momentum:g}")
    if tr.sync == "streaming":
        if not 2 <= tr.fragments <= MAX_FRAGMENTS:
            raise ConfigError(f"config: training.fragments must be 2..{MAX_FRAGMENTS}, "
                              f"not {tr.fragments}")
        if tr.inner_steps % tr.fragments:
            raise ConfigError(f"config: training.fragments = {tr.fragments} does not divide "
                              f"training.inner_steps = {tr.inner_steps}")
        if not 0 <= tr.merge < 1:
            raise ConfigError(f"config: training.merge must be in [0, 1), not {tr.merge:g}")
        if tr.overlap and tr.inner_steps // tr.fragments < 2:
            raise ConfigError(f"config: training.overlap needs training.inner_steps / "
                              f"training.fragments of 2 or more, not "
                              f"{tr.inner_steps} / {tr.fragments}")
    elif tr.overlap:
        raise ConfigError(f'config: training.overlap is for sync = "streaming", not '
                          f"{tr.sync!r}")


def _check_adaptive(ad: AdaptiveConfig, tr: TrainingConfig) -> None:
    if bad := [p for p in ad.pin if p not in ADAPTIVE_PINS]:
        raise ConfigError(f"config: adaptive.pin may name {', '.join(ADAPTIVE_PINS)}, "
                          f"not {bad[0]!r}")
    if ad.min_wire not in WIRE_FORMATS:
        raise ConfigError(f"config: adaptive.min_wire must be one of {', '.join(WIRE_FORMATS)}, "
                          f"not {ad.min_wire!r}")
    if not ad.syncs or (bad := [m for m in ad.syncs if m not in SYNC_MODES]):
        raise ConfigError(f"config: adaptive.syncs must name some of {', '.join(SYNC_MODES)}, "
                          f"not {list(ad.syncs)!r}")
    if not 1 <= ad.max_inner_steps <= MAX_INNER_STEPS:
        raise ConfigError(f"config: adaptive.max_inner_steps must be 1..{MAX_INNER_STEPS}, "
                          f"not {ad.max_inner_steps}")
    if not 0 <= ad.hysteresis < 1:
        raise ConfigError(f"config: adaptive.hysteresis must be in [0, 1), not {ad.hysteresis:g}")
    if not 1 <= ad.straggler_retry_s <= 3600:
        raise ConfigError(f"config: adaptive.straggler_retry_s must be 1..3600 seconds, not "
                          f"{ad.straggler_retry_s:g}")
    if not 1 <= ad.dwell <= 1000 or ad.min_interval_s < 0:
        raise ConfigError(f"config: adaptive.dwell must be 1..1000 and adaptive.min_interval_s "
                          f">= 0, not {ad.dwell} and {ad.min_interval_s:g}")
    if not ad.enabled:
        return
    # The run starts under [training]: a start the bounds forbid is a contradiction, pinned or not.
    if WIRE_RANK[tr.wire] < WIRE_RANK[ad.min_wire]:
        raise ConfigError(f"config: training.wire = {tr.wire!r} is below adaptive.min_wire = "
                          f"{ad.min_wire!r}")
    if tr.sync not in ad.syncs:
        raise ConfigError(f"config: training.sync = {tr.sync!r} is not in adaptive.syncs = "
                          f"{list(ad.syncs)!r}")
    if tr.sync != "every-step" and tr.inner_steps > ad.max_inner_steps:
        raise ConfigError(f"config: training.inner_steps = {tr.inner_steps} is above "
                          f"adaptive.max_inner_steps = {ad.max_inner_steps}")


def load_config(path: str | Path | None = None, **overrides: Any) -> Config:
    """Load defaults, then the TOML file, then non-None ``overrides``; validate the result.

    Args:
        path: a TOML file. ``None`` reads :data:`DEFAULT_CONFIG` if it exists.
        **overrides: values from command-line flags, keyed like the top-level TOML keys.

    Raises:
        ConfigError: naming the first bad key.
    """
    data: dict[str, Any] = {}
    if path is None and DEFAULT_CONFIG.is_file():
        path = DEFAULT_CONFIG
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config: file {str(path)!r} not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config: cannot read {str(path)!r}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    for key, value in overrides.items():
        if key not in OVERRIDABLE:
            raise ConfigError(f"config: --{key.replace('_', '-')} is not a known flag")
        if value is not None:
            data[key] = value
    return validate(_build(Config, data, ""))


def as_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain data, with the password masked (for logs and `ping`)."""
    out = dataclasses.asdict(cfg)
    if out["mqtt"]["password"]:
        out["mqtt"]["password"] = "***"
    if out["secret"]:
        out["secret"] = "***"
    return out
