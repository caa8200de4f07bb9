"""Fixtures of the testbed tests: real namespaces under a per-session prefix, always removed.

Every testbed made here has a run id ``x<session><n>``, so its names start with
``chaos-x<session>``. The session fixture fails the run if anything with that prefix (a
namespace, a root-namespace link) or any process started from this session's temp dir is left
once the tests are done, and removes it.
"""

from __future__ import annotations

import itertools
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from chaosctl import polling
from chaosctl.testbed.core import Testbed
from chaosctl.testbed.scenario import Runner, load
from netprobe import netns


def _session_tag() -> str:
    """Two hex digits, random per run, but never the same for two pytest-xdist workers of one
    run (up to 4): the worker's number picks the low bits, so their names cannot collide."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return f"{secrets.randbelow(64) * 4 + int(worker[2:] or 0) % 4:02x}"


SESSION = _session_tag()
SESSION_PREFIX = f"{netns.ROOT_PREFIX}x{SESSION}"
_counter = itertools.count(1)


def run_id() -> str:
    """A fresh run id under this session's prefix (at most 6 characters)."""
    return f"x{SESSION}{next(_counter):02x}"[:6]


def need_root() -> None:
    """Skip with the reason when namespaces cannot be used here."""
    reason = netns.netns_unavailable_reason()
    if reason is not None:
        pytest.skip(f"testbed test skipped: {reason}")


def run_scenario(tmp_path: Path, text: str) -> dict[str, Any]:
    """Run the scenario ``text`` on a fresh testbed (skipped without namespaces); its report,
    once every invariant held and every event was carried out."""
    need_root()
    path = tmp_path / "s.toml"
    path.write_text(text)
    report = Runner(load(path), tmp_path / "run", lambda _line: None, run_id=run_id()).run()
    assert report["failures"] == [], report["failures"]
    assert all(entry["ok"] for entry in report["timeline"]), report["timeline"]
    return report


def _ours() -> set[int]:
    """This process and its ancestors: pytest run with ``--basetemp DIR`` names the temp dir
    on its own command line, and must not count (or kill) itself."""
    return {os.getpid(), *(p.pid for p in psutil.Process().parents())}


def leftovers(base: Path) -> list[str]:
    """Everything of this session still alive: namespaces, root links, processes."""
    found = [f"netns {n}" for n in netns.list_netns(SESSION_PREFIX)]
    found += [f"link {n}" for n in netns.list_links(SESSION_PREFIX)]
    ours = _ours()
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if (str(base) in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE
                and proc.info["pid"] not in ours):
            found.append(f"pid {proc.info['pid']}: {cmd[:120]}")
    return found


@pytest.fixture(scope="session", autouse=True)
def nothing_leaks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fail the session if any testbed made by it left anything behind."""
    base = tmp_path_factory.getbasetemp()
    yield
    if netns.netns_unavailable_reason() is not None:
        return
    left = leftovers(base)
    if left:
        netns.cleanup(SESSION_PREFIX)
        ours = _ours()
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if str(base) in " ".join(proc.info["cmdline"] or []) and proc.pid not in ours:
                proc.kill()
    assert not left, f"testbed tests leaked: {left}"


@pytest.fixture
def make_testbed(tmp_path: Path) -> Iterator[Callable[..., Testbed]]:
    """Build testbeds under ``tmp_path``; each is torn down after the test, and checked."""
    need_root()
    made: list[Testbed] = []

    def make(nodes: int = 4, topology: str = "ring", up: bool = True, **kw: Any) -> Testbed:
        start_daemons = bool(kw.pop("start_daemons", True))
        tb = Testbed(tmp_path / f"tb{len(made)}", nodes, topology, run_id=run_id(), **kw)
        made.append(tb)
        if up:
            tb.up(start_daemons=start_daemons)
        return tb

    yield make
    for tb in made:
        tb.down(grace_s=2.0)
        assert netns.list_netns(tb.state.prefix) == [], "namespaces leaked past down()"


def reach(tb: Testbed, src: str, dst: str, port: int = 9) -> str:
    """Try TCP from ``src``'s namespace to ``dst``'s data address.

    Returns ``connected`` or ``refused`` (the address is reachable: a closed port answers with
    a reset), or ``unreachable``/``timeout`` (it is not).
    """
    code = (
        "import socket,sys\n"
        "s=socket.socket(); s.settimeout(1.0)\n"
        f"try:\n s.connect(({tb.addr_of(dst)!r},{port})); print('connected')\n"
        "except ConnectionRefusedError: print('refused')\n"
        "except TimeoutError: print('timeout')\n"
        "except OSError as e: print('unreachable' if e.errno in (101,113) else f'error {e}')\n"
    )
    proc = tb.exec(src, ["python3", "-c", code], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=10)
    return out.decode().strip()


def wait_until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``pred`` until truthy; fail the test naming ``what``."""
    return polling.wait_until(pred, timeout, what, 0.1, AssertionError)
