"""Suite-wide hooks: a failed test shows the tails of the logs its processes left.

CI keeps only the test output, not the temporary directories, so a failure of a test that runs
daemons and workers carries the last lines each of them logged (DEBUG left out).
"""
from __future__ import annotations

import os
import resource
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

TAIL_LINES = 10
MAX_FILES = 10
LINE_CHARS = 200


def _tail(path: Path) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    lines = [line[:LINE_CHARS] for line in text.splitlines() if " DEBUG " not in line]
    return lines[-TAIL_LINES:]


def log_tails(root: Path) -> str:
    """The newest logs under ``root``, each with its last lines."""
    logs = sorted(root.rglob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    out = []
    for path in logs[:MAX_FILES]:
        lines = _tail(path)
        if lines:
            out.append(f"--- {path.relative_to(root)}")
            out.extend(lines)
    return "\n".join(out)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed or call.when not in ("setup", "call"):
        return
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    root = tmp if isinstance(tmp, Path) else None
    factory = getattr(item.config, "_tmp_path_factory", None)
    if root is None and factory is not None:
        # A module fixture's cluster lives in the session's directory, not the test's: its
        # newest logs are the ones that failed.
        root = factory.getbasetemp()
    tails = log_tails(root) if root is not None and root.exists() else ""
    if tails:
        report.sections.append(("process logs (tails)", tails))


#: Where the suite's long tests live (real clusters training, the testbed, the simulator's
#: campaign): collected first, so the xdist workers start them first and finish together on
#: the short ones, rather than the last worker running a minute-long test alone at the end.
LONG_FIRST = ("tests/training/", "tests/testbed/", "tests/bench/", "tests/dst/",
              "tests/cli/test_demo.py", "tests/integration/test_bridge.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return next((i for i, p in enumerate(LONG_FIRST) if path.startswith(p)),
                    len(LONG_FIRST))

    items.sort(key=rank)  # stable: each module's tests stay together and in order


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI runner's cancel, ``timeout``, a kill of the run) unwinds like Ctrl-C, in
    the main process and in every xdist worker: the fixtures' finalizers run, and the
    daemons, brokers, namespaces and veths a test built go with them. With the default
    action the process died at once and left them all behind (a killed run in stop 34 left
    namespaces, chaosd, mosquitto and iperf3 running)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    # A shell without job control starts a background job (``cmd &``, nohup, a script) with
    # SIGINT ignored, and an ignored signal stays ignored across exec: every CLI process a
    # test sends Ctrl-C to would never see it (stop 37's venv run failed four such tests).
    # A handler, unlike SIG_IGN, resets to the default in the children.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _cpu_s() -> float:
    """CPU seconds of this process and of every child it has reaped (a reaped daemon's own
    reaped workers included)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With CHAOS_TEST_CPU=DIR, each test's CPU seconds (setup, call, teardown, the processes
    it started and reaped) are appended to DIR/<xdist worker>.tsv: the suite is CPU-bound on
    2 cores, so CPU, not wall time under load, says which tests to make cheaper."""
    out = os.environ.get("CHAOS_TEST_CPU")
    if not out:
        yield
        return
    cpu, wall = _cpu_s(), time.monotonic()
    yield
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(out) / f"{name}.tsv", "a") as f:
        f.write(f"{item.nodeid}\t{_cpu_s() - cpu:.2f}\t{time.monotonic() - wall:.2f}\n")
