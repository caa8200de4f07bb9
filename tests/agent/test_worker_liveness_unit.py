"""Worker liveness in chaosd: the poll-silence verdict on a fake clock, what the node agent
does with it, and the supervisor's kill-and-restart of a real (stopped) child process."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from daemon.agent import ops
from daemon.agent.memory import Job
from daemon.agent.node import NodeAgent
from daemon.agent.worker import WorkerSession, WorkerSupervisor, unresponsive_for
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import Config, WorkerConfig, load_config
from daemon.contracts.errors import ConfigError, ControlError
from daemon.contracts.messages import Request, decode
from tests.agent._wait import wait_for
from tests.agent.test_node import FakeBus

pytestmark = pytest.mark.timeout(30)
LIMIT = 4.0
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def attached(clock: FakeClock, pid: int = 4242) -> WorkerSession:
    w = WorkerSession()
    w.pid, w.state = pid, "active"
    w.attached_at = w.last_poll = clock.monotonic()
    return w


# --- the verdict -----------------------------------------------------------------------------
def test_silence_counts_from_the_last_poll() -> None:
    clock = FakeClock()
    w = attached(clock)
    clock.advance(LIMIT - 0.1)
    assert unresponsive_for(w, clock.monotonic(), LIMIT) is None
    w.last_poll = clock.monotonic()  # a poll resets it
    clock.advance(LIMIT - 0.1)
    assert unresponsive_for(w, clock.monotonic(), LIMIT) is None
    clock.advance(0.2)
    assert unresponsive_for(w, clock.monotonic(), LIMIT) == pytest.approx(LIMIT + 0.1)


def test_exempt_unattached_off_and_while_served() -> None:
    clock = FakeClock()
    idle = WorkerSession()  # started but not attached yet (importing torch): no session
    clock.advance(100)
    assert unresponsive_for(idle, clock.monotonic(), LIMIT) is None
    w = attached(clock)
    clock.advance(100)
    assert unresponsive_for(w, clock.monotonic(), 0) is None  # 0: the watchdog is off
    w = attached(clock)
    with w.serving(clock):  # a slow request of the worker's (probes): it waits on us
        clock.advance(LIMIT * 3)
        assert unresponsive_for(w, clock.monotonic(), LIMIT) is None
    assert w.last_poll == clock.monotonic()  # the answer counts as a poll
    clock.advance(LIMIT)
    assert unresponsive_for(w, clock.monotonic(), LIMIT) == pytest.approx(LIMIT)


def test_config_key_default_and_one_line_errors(tmp_path: Path) -> None:
    assert Config().worker.poll_silence_s == WorkerConfig().poll_silence_s == LIMIT
    conf = tmp_path / "chaosd.toml"
    conf.write_text("[worker]\npoll_silence_s = 0\n")
    assert load_config(conf).worker.poll_silence_s == 0.0
    for bad in ("0.2", "-1", '"soon"', "99999"):
        conf.write_text(f"[worker]\npoll_silence_s = {bad}\n")
        with pytest.raises(ConfigError) as err:
            load_config(conf)
        assert "worker.poll_silence_s" in str(err.value) and "\n" not in str(err.value)


# --- the node agent's reaction ---------------------------------------------------------------
def agent_with_worker(tmp_path: Path, pid: int) -> tuple[NodeAgent, FakeClock]:
    clock = FakeClock()
    cfg = Config(node_id="n1", cluster="t", data_dir=str(tmp_path), socket=str(tmp_path / "s"))
    agent = NodeAgent(cfg, clock)
    agent.worker.pid, agent.worker.state = pid, "active"
    agent.worker.last_poll = clock.monotonic()
    return agent, clock


def requests(agent: NodeAgent) -> list[Request]:
    return [decode(q.payload, Request) for q in agent._pending  # type: ignore[misc]
            if q.topic == agent.topics.req]


def test_hung_worker_started_by_hand_is_dropped_with_its_reason(tmp_path: Path) -> None:
    agent, clock = agent_with_worker(tmp_path, os.getpid())  # alive, and not our child
    clock.advance(LIMIT - 0.5)
    agent.check_worker()
    assert agent.worker.attached and not requests(agent)
    clock.advance(1.0)
    agent.check_worker()
    assert not agent.worker.attached
    [req] = requests(agent)
    assert req.op == "worker-exit" and req.args == {"code": -1, "reason": "worker-unresponsive"}
    assert agent.counters["worker_unresponsive"] == 1
    agent.check_worker()  # reported once
    assert len(requests(agent)) == 1


def test_a_refused_worker_silent_while_it_exits_is_reported_refused(tmp_path: Path) -> None:
    """Seen in the suite on a loaded box: a joiner refused for a model that does not fit went
    silent as it exited, and the watchdog's verdict reported it hung, so the cluster never
    scaled it in as refused."""
    agent, clock = agent_with_worker(tmp_path, os.getpid())
    agent.supervisor.refuse("n1 cannot join cluster state of step 3: model differs")
    clock.advance(LIMIT + 0.1)
    agent.check_worker()
    [req] = requests(agent)
    assert req.op == "worker-exit" and req.args == {"code": -1, "reason": "state-refused"}


def test_a_frozen_daemon_does_not_blame_its_worker(tmp_path: Path) -> None:
    agent, clock = agent_with_worker(tmp_path, os.getpid())
    clock.advance(LIMIT * 5)  # the daemon itself was stopped: no tick, no poll served
    agent.check_worker(paused=True)
    assert agent.worker.attached and not requests(agent)
    clock.advance(LIMIT + 0.1)  # from then on, silence counts again
    agent.check_worker()
    assert not agent.worker.attached


def test_a_gone_worker_started_by_hand_is_a_plain_exit(tmp_path: Path) -> None:
    agent, _ = agent_with_worker(tmp_path, 2**22 + 12345)  # beyond pid_max: no process
    agent.check_worker()
    [req] = requests(agent)
    assert req.args == {"code": -1, "reason": "worker-exit"}


async def test_a_script_killed_and_started_again_by_hand_joins_after_the_old_ones_exit(
        tmp_path: Path) -> None:
    """The simulator's seed 960: a worker started by hand was killed and its owner started the
    script again before chaosd's next tick. The new worker's attach took the old one's seat,
    its join left the old worker in the rounds until the join took effect, and they waited on
    it until the step timeout. The old worker's exit is said first, then the join."""
    agent, _ = agent_with_worker(tmp_path, 2**22 + 12345)  # the old one: gone
    agent.bus = bus = FakeBus(agent)
    await ops.worker_attach(agent, {"pid": os.getpid(), "port": 7001, "host": "127.0.0.1"})
    assert agent.worker.pid == os.getpid()
    sent = [decode(o.payload, Request) for o in bus.sent if o.topic == agent.topics.req]
    assert [(r.op, r.args.get("reason")) for r in sent] == [  # type: ignore[attr-defined]
        ("worker-exit", "worker-exit"), ("join", None)]


async def test_a_second_worker_is_refused_while_the_first_one_lives(tmp_path: Path) -> None:
    agent, _ = agent_with_worker(tmp_path, os.getppid())  # alive, and not our child
    with pytest.raises(ControlError, match="another worker"):
        await ops.worker_attach(agent, {"pid": os.getpid(), "port": 7001, "host": "127.0.0.1"})
    assert agent.worker.pid == os.getppid() and not requests(agent)


# --- the supervisor, with a real child ---------------------------------------------------------
async def test_kill_of_a_stopped_worker_restarts_it(tmp_path: Path) -> None:
    sup = WorkerSupervisor(str(tmp_path), {})
    exits: list[int] = []
    sup.on_exit.append(exits.append)
    sup.start(Job(SLEEPER))
    try:
        await wait_for(lambda: sup.pid is not None)
        first = sup.pid
        assert first is not None and sup.owns(first) and not sup.owns(os.getpid())
        os.kill(first, signal.SIGSTOP)
        assert sup.kill()
        await wait_for(lambda: exits)
        assert exits == [-signal.SIGKILL] and sup.restarts == 1
        with pytest.raises(RuntimeError):  # waiting out its backoff still counts as running
            sup.start(Job(SLEEPER))
        await wait_for(lambda: sup.pid not in (None, first))
    finally:
        await asyncio.wait_for(sup.stop(), 20)
    assert not sup.running and not sup.supervising


async def test_a_worker_that_exits_while_it_leaves_is_not_restarted(tmp_path: Path) -> None:
    """The soak's hour in stop 36: a worker crashed a moment after the operator's leave, was
    restarted, and its new session, knowing nothing of the leave, trained on for 14 min."""
    sup = WorkerSupervisor(str(tmp_path), {})
    exits: list[int] = []
    sup.on_exit.append(exits.append)
    sup.start(Job([sys.executable, "-c", "import sys, time; time.sleep(1); sys.exit(1)"]))
    try:
        await wait_for(lambda: sup.pid is not None)
        sup.forget()  # ops.leave: the operator's word
        await wait_for(lambda: not sup.supervising)
        assert exits == [1] and sup.restarts == 0 and not sup.running
        assert sup.resume() is None  # nor after a reboot
        sup.start(Job(SLEEPER))  # a later join supervises as before
        await wait_for(lambda: sup.pid is not None)
        assert sup.kill()
        await wait_for(lambda: sup.restarts == 1)
    finally:
        await asyncio.wait_for(sup.stop(), 20)


async def test_stop_ends_a_stopped_worker_without_waiting_for_the_grace(
        tmp_path: Path) -> None:
    sup = WorkerSupervisor(str(tmp_path), {})
    sup.start(Job(SLEEPER))
    try:
        await wait_for(lambda: sup.pid is not None)
        pid = sup.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        # SIGTERM alone stays pending on a stopped process; SIGCONT lets it act at once.
        await asyncio.wait_for(sup.stop(grace=60), 20)
    finally:
        await sup.stop(grace=1)
    assert sup.last_exit == -signal.SIGTERM and sup.restarts == 0


async def test_the_worker_runs_nicer_than_chaosd(tmp_path: Path) -> None:
    """``[worker] nice``: the worker runs that much below chaosd's priority (the default, 0,
    runs it alike)."""
    async def niceness_of_a_worker(nice: int) -> int:
        sup = WorkerSupervisor(str(tmp_path), {}, nice=nice)
        sup.start(Job(SLEEPER))
        try:
            await wait_for(lambda: sup.pid is not None)
            pid = sup.pid
            assert pid is not None
            return os.getpriority(os.PRIO_PROCESS, pid)
        finally:
            await asyncio.wait_for(sup.stop(), 20)

    assert load_config(None).worker.nice == 0
    assert await niceness_of_a_worker(5) == os.nice(0) + 5
    assert await niceness_of_a_worker(0) == os.nice(0)


def test_a_niceness_out_of_range_is_refused_in_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "chaosd.toml"
    for bad in ("20", "-1", '"low"', "2.5"):
        conf.write_text(f"[worker]\nnice = {bad}\n")
        with pytest.raises(ConfigError) as err:
            load_config(conf)
        assert "worker.nice" in str(err.value) and "\n" not in str(err.value)
