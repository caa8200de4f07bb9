"""``chaosctl testbed`` argument errors: exit 2 (or 1) and one line, before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import assert_one_line_error, run_ctl

pytestmark = pytest.mark.timeout(60)


def test_help_lists_the_commands() -> None:
    out = run_ctl("testbed", "--help").stdout
    for cmd in ("up", "down", "status", "cut", "heal", "shape", "exec"):
        assert cmd in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--topology", "mesh"], "--topology must be one of"),
        (["--bw", "10-5"], "--bw needs"),
        (["--bw", "fast"], "--bw must be"),
        (["--qdisc", "fq"], "--qdisc must be tbf or htb"),
        (["--nodes", "0"], "--nodes"),
        (["--delay", "20"], "netem"),
        (["--loss", "1"], "netem"),
    ],
)
def test_up_usage_errors(tmp_path: Path, args: list[str], needle: str) -> None:
    line = assert_one_line_error(run_ctl("testbed", "up", "--dir", str(tmp_path), *args), 2)
    assert needle in line
    assert not (tmp_path / "testbed.json").exists()


@pytest.mark.parametrize(
    "args",
    [["status"], ["cut", "n1", "n2"], ["heal", "n1", "n2"], ["shape", "n1", "n2", "--mbit", "5"],
     ["exec", "n1", "--", "true"]],
)
def test_commands_without_a_testbed_exit_1(tmp_path: Path, args: list[str]) -> None:
    cmd, rest = args[0], args[1:]
    if cmd == "exec":
        argv = ["testbed", cmd, "--dir", str(tmp_path), *rest]
    else:
        argv = ["testbed", cmd, *rest, "--dir", str(tmp_path)]
    line = assert_one_line_error(run_ctl(*argv), 1)
    assert "no testbed in" in line


def test_down_without_a_testbed_is_fine(tmp_path: Path) -> None:
    proc = run_ctl("testbed", "down", "--dir", str(tmp_path))
    assert proc.returncode == 0
    assert "nothing to do" in proc.stdout
