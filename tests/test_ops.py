"""Operations artefacts: `systemd-analyze verify` accepts the unit; the man pages render clean."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "chaosd.service"
MAN_PAGES = [ROOT / "man" / name for name in ("chaosctl.1", "chaosd.8", "chaosd.toml.5")]


@pytest.fixture
def manpath(tmp_path: Path) -> Path:
    """Our pages laid out as a man hierarchy, so `man chaosd(8)` resolves."""
    root = tmp_path / "man"
    for page in MAN_PAGES:
        section = root / f"man{page.suffix.lstrip('.')}"
        section.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, section / page.name)
    return root


def test_unit_passes_systemd_analyze_verify(tmp_path: Path, manpath: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    chaosd = shutil.which("chaosd")
    if chaosd is None:
        pytest.skip("the chaosd console script is not installed (pip install -e .)")
    text = UNIT.read_text()
    assert "ExecStart=/usr/local/bin/chaosd --config /etc/chaos/chaosd.toml" in text
    # verify checks that ExecStart's binary exists; point it at this installation's chaosd.
    unit = tmp_path / "chaosd.service"
    unit.write_text(text.replace("/usr/local/bin/chaosd", chaosd))
    # It also runs `man` for each Documentation= page: serve ours through MANPATH.
    env = {**os.environ, "MANPATH": str(manpath), "SYSTEMD_LOG_COLOR": "0"}
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                          env=env, timeout=60)
    own = [line for line in proc.stderr.splitlines() if "chaosd.service" in line]
    assert proc.returncode == 0 and not own, proc.stderr


def test_unit_has_the_required_settings() -> None:
    settings = dict(
        line.split("=", 1) for line in UNIT.read_text().splitlines()
        if re.match(r"^[A-Za-z]+=", line)
    )
    expected = {
        "Type": "notify", "NotifyAccess": "main", "Restart": "on-failure",
        "WatchdogSec": "10", "RuntimeDirectory": "chaos", "StateDirectory": "chaos",
        "After": "network-online.target", "Wants": "network-online.target",
        "WantedBy": "multi-user.target",
    }
    for key, value in expected.items():
        assert settings.get(key) == value, key
    assert "RestartSec" in settings


@pytest.mark.parametrize("page", MAN_PAGES, ids=lambda p: p.name)
def test_man_page_renders_without_warnings(page: Path) -> None:
    groff = shutil.which("groff")
    if groff is None:
        pytest.skip("groff is not installed (apt-get install groff-base)")
    proc = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-z", str(page)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr

    man = shutil.which("man")
    if man is None:
        return
    env = {**os.environ, "MANWIDTH": "80"}
    proc = subprocess.run([man, "--warnings", "-l", str(page)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    text = re.sub(r".\x08", "", proc.stdout)  # drop the pager's overstrike bold/underline
    title = page.name.rsplit(".", 1)[0].upper()
    assert title in text and "NAME" in text and "SEE ALSO" in text
