"""chaosd remembers the job it supervises (issue 21): the file, the supervisor's use of it with
real child processes, the ``join`` op's new arguments, and the ``job-failed`` report."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from daemon.agent import ops
from daemon.agent.memory import JOB_FILE, Job, JobMemory
from daemon.agent.node import NodeAgent
from daemon.agent.worker import WorkerSupervisor
from daemon.cluster.primitives import Negotiator
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import Config
from daemon.contracts.errors import ControlError
from daemon.contracts.messages import Request, decode
from daemon.contracts.protocol import WorkerExit, parse_request
from tests.agent._wait import wait_for

pytestmark = pytest.mark.timeout(30)


def test_a_job_is_kept_privately_and_read_back(tmp_path: Path) -> None:
    mem = JobMemory(str(tmp_path))
    assert mem.load() is None
    job = Job(argv=["python", "train.py"], cwd="/srv/run", env={"HF_TOKEN": "x"},
              neighbors=["b"])
    mem.save(job)
    assert mem.load() == job
    assert (tmp_path / JOB_FILE).stat().st_mode & 0o777 == 0o600
    mem.forget()
    assert mem.load() is None and not (tmp_path / JOB_FILE).exists()
    mem.forget()  # forgetting twice is fine


@pytest.mark.parametrize("text", ["", "{", "[]", '{"argv": []}', '{"argv": ["x"], "env": 3}',
                                  '{"argv": [1], "cwd": "", "env": {}, "neighbors": []}'])
def test_a_file_that_is_no_job_is_ignored_with_one_line(
        tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / JOB_FILE).write_text(text)
    assert JobMemory(str(tmp_path)).load() is None
    [rec] = [r for r in caplog.records if "ignoring the remembered job" in r.getMessage()]
    assert "\n" not in rec.getMessage()


async def test_the_job_runs_where_and_as_asked_and_a_clean_exit_forgets_it(
        tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out.json"
    work.mkdir()
    script = ("import json, os; json.dump({'cwd': os.getcwd(), 'v': os.environ.get('JOB_V'), "
              f"'node': os.environ.get('CHAOS_NODE_ID')}}, open({str(out)!r}, 'w'))")
    sup = WorkerSupervisor(str(tmp_path), {"CHAOS_NODE_ID": "n1"})
    sup.start(Job(argv=[sys.executable, "-c", script], cwd=str(work),
                  env={"JOB_V": "42", "PATH": "/usr/bin:/bin"}))
    assert JobMemory(str(tmp_path)).load() is not None  # remembered at once
    await wait_for(lambda: sup.last_exit is not None)
    assert sup.last_exit == 0
    assert json.loads(out.read_text()) == {"cwd": str(work), "v": "42", "node": "n1"}
    assert JobMemory(str(tmp_path)).load() is None  # done: nothing to resume


async def test_stopping_chaosd_keeps_the_job_and_the_next_start_resumes_it(
        tmp_path: Path) -> None:
    sleeper = Job(argv=[sys.executable, "-c", "import time; time.sleep(120)"])
    sup = WorkerSupervisor(str(tmp_path), {})
    sup.start(sleeper)
    await wait_for(lambda: sup.pid is not None)
    await asyncio.wait_for(sup.stop(grace=5), 20)  # a reboot stops chaosd too
    assert JobMemory(str(tmp_path)).load() == sleeper
    again = WorkerSupervisor(str(tmp_path), {})  # chaosd, started again
    try:
        assert again.resume() == sleeper
        await wait_for(lambda: again.pid is not None)
    finally:
        await asyncio.wait_for(again.stop(grace=5), 20)
    again.forget()  # the operator's leave
    assert WorkerSupervisor(str(tmp_path), {}).resume() is None


async def test_a_command_that_cannot_start_is_said_once_forgotten_and_not_retried(
        tmp_path: Path) -> None:
    sup = WorkerSupervisor(str(tmp_path), {})
    exits: list[int] = []
    sup.on_exit.append(exits.append)
    sup.start(Job(argv=[str(tmp_path / "gone" / "train.py")]))
    await wait_for(lambda: exits)
    await asyncio.sleep(1.5)  # past the first restart's backoff: still one exit
    assert exits == [127] and not sup.supervising and sup.restarts == 0
    assert sup.start_error is not None and "gone/train.py" in sup.start_error
    assert JobMemory(str(tmp_path)).load() is None


def test_the_daemon_reports_a_job_that_could_not_start(tmp_path: Path) -> None:
    cfg = Config(node_id="n1", cluster="t", data_dir=str(tmp_path), socket=str(tmp_path / "s"))
    agent = NodeAgent(cfg, FakeClock())
    agent.supervisor.start_error = "cannot start worker /x/train.py: No such file"
    agent._worker_exited(127)
    [req] = [decode(q.payload, Request) for q in agent._pending  # type: ignore[misc]
             if q.topic == agent.topics.req]
    assert req.op == "worker-exit" and req.args == {
        "code": 127, "reason": "job-failed", "detail": agent.supervisor.start_error}
    # ... and the scheduler says so in one event (the node is no member: no scale-in).
    clock = FakeClock()
    neg = Negotiator(Scheduler("s", 1, None, clock), clock, lambda _n: 0)
    body = parse_request(req.op, req.args)
    assert isinstance(body, WorkerExit)
    assert neg.handle("n1", body) is None
    [ev] = neg.sched.events
    assert ev.kind == "job-failed" and ev.node == "n1" and ev.detail["code"] == 127
    assert "train.py" in ev.detail["detail"]


@pytest.mark.parametrize(("args", "says"), [
    ({"command": ["x"], "cwd": "relative/dir"}, "'cwd' must be"),
    ({"command": ["x"], "cwd": "/nonexistent/dir"}, "'cwd' must be"),
    ({"command": ["x"], "cwd": 3}, "'cwd' must be"),
    ({"command": ["x"], "env": ["A=1"]}, "'env' must map"),
    ({"command": ["x"], "env": {"A": 1}}, "'env' must map"),
])
def test_join_refuses_a_bad_cwd_or_env_in_one_line(
        tmp_path: Path, args: dict[str, object], says: str) -> None:
    cfg = Config(node_id="n1", cluster="t", data_dir=str(tmp_path), socket=str(tmp_path / "s"))
    agent = NodeAgent(cfg, FakeClock())
    with pytest.raises(ControlError) as err:
        ops.join(agent, args)
    assert says in str(err.value) and "\n" not in str(err.value)
    assert JobMemory(str(tmp_path)).load() is None
