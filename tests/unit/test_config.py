"""Config: defaults, TOML, flag precedence, and one clear line naming each bad key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from daemon.contracts.config import as_dict, load_config, require_secret
from daemon.contracts.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "chaosd.toml"
    path.write_text(text)
    return path


def test_toml_then_flags_take_precedence(tmp_path: Path) -> None:
    path = write(tmp_path, 'node_id = "box-a"\ncluster = "lab"\n[detector]\nphi_threshold = 6\n')
    cfg = load_config(path, node_id="box-b", cluster=None)
    assert cfg.node_id == "box-b"  # flag beats file
    assert cfg.cluster == "lab"  # file beats default; a None flag is no override
    assert cfg.detector.phi_threshold == 6.0
    assert cfg.broker_endpoint == ("embedded", "127.0.0.1", 1883)


def test_broker_urls(tmp_path: Path) -> None:
    assert load_config(None, broker="mqtt://gw:1999").broker_endpoint == ("mqtt", "gw", 1999)
    assert load_config(None, broker="mqtts://gw").broker_endpoint == ("mqtts", "gw", 8883)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('nodeid = "x"\n', "nodeid"),
        ('[detector]\nphi = 3\n', "detector.phi"),
        ('[detector]\nphi_threshold = "high"\n', "detector.phi_threshold"),
        ('[mqtt]\nkeepalive_s = true\n', "mqtt.keepalive_s"),
        ('[mqtt]\nkeepalive_s = 0\n', "mqtt.keepalive_s"),
        ('broker = "http://x"\n', "broker"),
        ('broker = "mqtt://x:99999"\n', "broker"),
        ('node_id = "has space"\n', "node_id"),
        ('log_level = "loud"\n', "log_level"),
        ('[election]\nstagger_s = -1\n', "election.stagger_s"),
        ('[election]\ncontest_s = -1\n', "election.contest_s must be 0 (off) to 60"),
        ('[election]\ncontest_s = 600\n', "election.contest_s must be 0 (off) to 60"),
        ('mqtt = 3\n', "mqtt"),
        ('[mqtt]\nca_file = "/nonexistent/ca.pem"\n', "mqtt.ca_file"),
        ("node_id = \n", "TOML"),
        ('[replication]\nstrategy = "fastest"\n', "replication.strategy"),
        ('[replication]\nstrategy = "stop-resume"\n', "chaosctl bench scaleout"),
        ('[replication]\nserve_mbps = -5\n', "replication.serve_mbps"),
        ('[replication]\nsnapshot_reserve_mib = -1\n', "replication.snapshot_reserve_mib"),
        ('[training]\nwire = "int4"\n', "training.wire must be one of fp32, fp16, bf16, int8"),
        ('[training]\nwire = 8\n', "training.wire"),
        ('[training]\ncodec = "int8"\n', "training.codec"),
        ('[adaptive]\npin = "wire"\n', "adaptive.pin must be a list of strings"),
        ('[adaptive]\npin = ["codec"]\n', "adaptive.pin may name sync, wire, inner_steps"),
        ('[adaptive]\nmin_wire = "int4"\n', "adaptive.min_wire"),
        ('[adaptive]\nsyncs = []\n', "adaptive.syncs"),
        ('[adaptive]\nhysteresis = 1.5\n', "adaptive.hysteresis"),
        ('[adaptive]\nstraggler_retry_s = 0\n', "adaptive.straggler_retry_s must be 1..3600"),
        ('[adaptive]\nstraggler_retry_s = nan\n', "adaptive.straggler_retry_s must be 1..3600"),
        ('[adaptive]\nstragglers = "yes"\n', "adaptive.stragglers must be true or false"),
        # The example: a pinned policy that contradicts a bound names both keys.
        ('[training]\nwire = "int8"\n[adaptive]\nenabled = true\npin = ["wire"]\n'
         'min_wire = "bf16"\n',
         "training.wire = 'int8' is below adaptive.min_wire = 'bf16'"),
        ('[training]\nsync = "diloco"\ninner_steps = 500\n[adaptive]\nenabled = true\n',
         "training.inner_steps = 500 is above adaptive.max_inner_steps = 100"),
        ('[adaptive]\nenabled = true\nsyncs = ["diloco"]\n',
         "training.sync = 'every-step' is not in adaptive.syncs"),
        ("[probe]\nbandwidth_period_s = -1\n", "probe.bandwidth_period_s must be >= 0 (0: off)"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, names: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert names in str(err.value)
    assert "\n" not in str(err.value)


def test_the_wire_format_is_fp32_unless_the_file_names_another(tmp_path: Path) -> None:
    assert load_config(None).training.wire == "fp32"
    for wire in ("fp32", "fp16", "bf16", "int8"):
        assert load_config(write(tmp_path, f'[training]\nwire = "{wire}"\n')).training.wire == wire


def test_a_bandwidth_period_of_zero_turns_the_background_tests_off(tmp_path: Path) -> None:
    from daemon.agent.probes import LinkMonitor

    cfg = load_config(write(tmp_path, "[probe]\nbandwidth_period_s = 0\n")).probe
    assert cfg.bandwidth_period_s == 0
    assert LinkMonitor(cfg, "127.0.0.1", lambda _m: None).periodic is None
    assert LinkMonitor(load_config(None).probe, "127.0.0.1", lambda _m: None).periodic


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/chaosd.toml")


def test_chaosd_refuses_bad_config_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[detector]\nheartbeat_interval = 1\n')
    proc = subprocess.run([sys.executable, "-m", "daemon.agent.main", "--config", str(path)],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "detector.heartbeat_interval" in lines[0]
    assert "Traceback" not in proc.stderr


def test_chaosd_without_a_secret_refuses_to_start(tmp_path: Path) -> None:
    path = write(tmp_path, 'cluster = "lab"\n')
    proc = subprocess.run([sys.executable, "-m", "daemon.agent.main", "--config", str(path)],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "secret" in lines[0] and "--insecure" in lines[0], lines
    assert "Traceback" not in proc.stderr


def test_insecure_is_a_flag_and_a_key(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "insecure = true\n")).insecure
    assert load_config(write(tmp_path, ""), insecure=True).insecure
    cfg = load_config(write(tmp_path, ""))
    assert not cfg.insecure and cfg.control_key is None
    with pytest.raises(ConfigError, match="no 'secret'"):
        require_secret(cfg)
    secure = require_secret(load_config(write(tmp_path, 'secret = "0123456789abcdef01"\n')))
    assert secure.control_key is not None and secure.control_key != secure.data_key
    assert as_dict(secure)["secret"] == "***"


@pytest.mark.parametrize(("text", "names"), [
    ('secret = "short"\n', "secret"),
    ("auth_window_s = 0.1\n", "auth_window_s"),
    ("insecure = 1\n", "insecure"),
])
def test_bad_auth_values_name_the_key(tmp_path: Path, text: str, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        load_config(write(tmp_path, text))
