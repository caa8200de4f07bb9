"""Switching the sync mode during a run (issue 24), on real models without a cluster.

The policy controller may move a running cluster between every-step sync, DiLoCo and
streaming DiLoCo, and change H. Here three members are driven round by round through such
switches, with the all-reduce done in the test (the sample-weighted mean the data plane
computes): every member must switch at the same step, hold the same state after every
committed round, number its rounds on without a gap or a repeat, and a joiner that restores
a snapshot taken after a switch must go on in step with them.
"""

from __future__ import annotations

import torch

from chaos_edge.replication.state import StateSpace
from chaos_edge.trainer.objects import Registry
from chaos_edge.trainer.replica import Replica
from chaos_edge.trainer.rhythm import Rhythm
from chaos_edge.trainer.stepper import Stepper
from daemon.contracts.policy import EVERY_STEP, SyncMode, SyncPolicy


def test_round_numbers_go_on_across_switches() -> None:
    r = Rhythm()
    assert [r.round_at(s) for s in (0, 1, 7)] == [0, 1, 7] and r.ends_round(3)
    r = r.switched(SyncMode("diloco", 4), 10)  # every-step to step 10: round 10
    assert (r.anchor_step, r.anchor_round) == (10, 10)
    assert [s for s in range(10, 23) if r.ends_round(s)] == [10, 14, 18, 22]
    assert [r.round_at(s) for s in (10, 13, 14, 18)] == [10, 10, 11, 12]
    assert r.last_round_step(17) == 14 and r.first_round_from(15) == 12
    assert [r.takes_over_at(s) for s in (10, 11, 14, 15)] == [10, 14, 14, 18]
    assert r.first_round_from(14) == 11 and r.first_round_from(3) <= 10
    r = r.switched(SyncMode("streaming", 6, fragments=3), 18)  # period 2 from step 18
    assert (r.anchor_round, r.round_at(20), r.round_at(23)) == (12, 13, 14)
    assert not r.same_rounds(SyncMode("streaming", 6, fragments=2))
    assert r.same_rounds(SyncMode("streaming", 6, outer_lr=0.3, fragments=3, merge=0.5))
    assert Rhythm.from_dict(r.to_dict()) == r
    assert Rhythm.legacy({"inner_steps": 8}).mode == SyncMode("diloco", 8)


def test_a_fence_is_never_before_the_first_round_its_policy_governs() -> None:
    """diloco H=20 from step 0, committed to step 990. A policy effective at 995 governs the
    round of step 1000 (round 50). If it switches to every-step, a policy effective at 1003
    governs round 53 (steps 1001, 1002, 1003 are rounds 51-53), not round 51 as the mode in
    force would say: fenced at 51, the rounds 51 and 52 of the policy before it would abort
    for good. Pending the switch the fence is at or past 53; with none pending it is exact."""
    r = Rhythm(SyncMode("diloco", 20))
    assert r.fence(995, 990) == 50 and r.fence(1003, 990) == 51
    assert r.fence(1003, 990, pending=[1]) >= 53
    assert r.fence(995, 990, pending=[1]) == 50  # effective by the next round: exact
    assert r.fence(1003, 990, pending=[40]) == 51  # slower rounds: no later than exact
    assert r.fence(500, 990, pending=[1]) == 25  # already in force: at once
    after = r.switched(EVERY_STEP, 1000)  # the switch landed: the fence is exact again
    assert after.fence(1003, 1000) == 53


def _member(seed: int) -> Replica:
    torch.manual_seed(0)  # every member starts from one model
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    rep = Replica(model, opt, Registry(None, None), Stepper(model, opt))
    rep.seed = seed  # type: ignore[attr-defined]
    return rep


def _update(reps: list[Replica], pub: SyncPolicy, step: int) -> bool:
    """One ``update()`` on every member; True if a round ran (and committed)."""
    for rep in reps:
        g = torch.Generator().manual_seed(1000 * rep.seed + step)  # type: ignore[attr-defined]
        rep.model(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
    local = {rep.inner_step(pub, 8) for rep in reps}
    assert len(local) == 1, "members disagree on whether this step ends with a round"
    if local.pop():
        return False
    inputs = []
    for rep in reps:
        n = rep.round_samples(8)
        vec, _ = rep.round_input(rep.stepper.gather(samples=n), n)
        inputs.append((vec.clone(), n))
    total = sum(n for _, n in inputs)
    avg = sum(v * n for v, n in inputs) / total
    for rep in reps:
        rep.commit(avg.clone(), pub.sync)
    return True


def test_members_switch_modes_together_and_stay_identical() -> None:
    """every-step, then DiLoCo H=3, then streaming (H=4, 2 fragments, merge 0.5), then H=6,
    then every-step again: each switch lands at the commit of the first round run under the
    new policy, at one step on every member; the digests agree after every round; round
    numbers go up by one a round; a joiner from a snapshot after the switches keeps up."""
    reps = [_member(s) for s in range(3)]
    plan = [(EVERY_STEP, 5), (SyncMode("diloco", 3), 9),
            (SyncMode("streaming", 4, fragments=2, merge=0.5), 10),
            (SyncMode("streaming", 6, fragments=2), 8), (EVERY_STEP, 4)]
    step, rounds, joiner, switches = 0, [], None, []
    for version, (mode, steps) in enumerate(plan, start=1):
        pub = SyncPolicy.build(version, ["a", "b", "c"], [("a", "b"), ("b", "c")], "b",
                               step, sync=mode)
        # Where the switch will land, as the adaptive bench reckons it: the policy governs
        # from the next step, and a round of the old mode is never cut short.
        landing = reps[0].rhythm.takes_over_at(step + 1)
        for _ in range(steps):
            step += 1
            before = reps[0].round_step()
            if _update(reps, pub, step):
                rounds.append(reps[0].round_step())
                assert rounds[-1] == before + 1, "a round number was skipped or repeated"
                digests = {rep.digest() for rep in reps}
                assert len(digests) == 1, f"members differ after the round of step {step}"
                assert {rep.step for rep in reps} == {step}
            assert {rep.rhythm for rep in reps} == {reps[0].rhythm}
        switches.append(reps[0].rhythm.anchor_step)
        assert version == 1 or switches[-1] == landing
        if mode.mode == "streaming" and mode.merge:  # a new node joins after this phase
            snap = reps[0].snapshot()
            joiner = _member(9)
            joiner.restore(StateSpace.load(snap.manifest, snap.buffer))
            assert joiner.rhythm == reps[0].rhythm and joiner.digest() == reps[0].digest()
            reps.append(joiner)
    assert joiner is not None and reps[-1] is joiner
    assert rounds == list(range(1, len(rounds) + 1))
    # Each switch is at the first round of the old mode at or after the policy's effective
    # step: to diloco at step 6, to streaming at 15 (diloco's rounds: 9, 12, 15), to H=6 at
    # 25 (streaming's: 17, ..., 25), back to every-step at 34 (H=6's: 28, 31, 34).
    assert switches == [0, 6, 15, 25, 34]
    assert reps[0].rhythm.mode == EVERY_STEP and reps[0].outer is None
    params = [torch.cat([p.detach().reshape(-1) for p in rep.model.parameters()])
              for rep in reps]
    assert all(torch.equal(params[0], p) for p in params[1:])


def test_leaving_diloco_loads_the_synced_parameters_and_a_fresh_inner_state() -> None:
    """Mid-window the members' own parameters and Adam moments differ; the switch to
    every-step makes every member take the synced parameters and start Adam afresh, so they
    hold one state again (a joiner starts the same way)."""
    reps = [_member(s) for s in range(2)]
    diloco = SyncPolicy.build(1, ["a", "b"], [("a", "b")], "a", 0,
                              sync=SyncMode("streaming", 4, fragments=2))
    for step in range(1, 5):
        _update(reps, diloco, step)
    assert all(rep.optimizer.state for rep in reps)
    every = SyncPolicy.build(2, ["a", "b"], [("a", "b")], "a", 5)
    assert _update(reps, every, 5) is False  # step 5 is an inner step: no round yet
    assert _update(reps, every, 6)  # the round of step 6 runs under v2 and switches
    for rep in reps:
        assert rep.outer is None and not rep.optimizer.state and rep.step == 6
    assert reps[0].digest() == reps[1].digest()
    params = [torch.cat([p.detach().reshape(-1) for p in rep.model.parameters()])
              for rep in reps]
    assert torch.equal(params[0], params[1])


def test_a_member_that_cannot_step_locally_says_why() -> None:
    """What a worker's polls carry to the controller (``cannot_diloco``): the DDP path and a
    GradScaler each keep the cluster out of the diloco modes, with the line to act on."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plain = Replica(model, opt, Registry(None, None), Stepper(model, opt))
    ddp = Replica(model, opt, Registry(None, None), Stepper(model, opt, steps=False))
    scaler = torch.amp.GradScaler("cpu")
    scaled = Replica(model, opt, Registry(None, None), Stepper(model, opt, scaler=scaler))
    assert plain.cannot_step_locally() == ""
    assert "DDP path" in ddp.cannot_step_locally()
    assert "GradScaler" in scaled.cannot_step_locally()


def test_a_held_result_keeps_the_mode_it_ran_under_through_a_snapshot() -> None:
    """An uncertain round's result waits for the next agreement, which may come after its
    policy has left the book (a book keeps the newest few): the sync mode it ran under is
    held with it, so its commit switches (or not) as it would have, and a joiner restored
    from a snapshot holds it too. A snapshot from before the mode was kept holds none (the
    Trainer then asks the book, and failing that keeps the mode in force)."""
    rep, mode = _member(0), SyncMode("diloco", 3)
    result = torch.arange(5, dtype=torch.float32)
    rep.hold(result, 7, mode)
    snap = rep.snapshot()
    joiner = _member(1)
    joiner.restore(StateSpace.load(snap.manifest, snap.buffer))
    assert (joiner.held_version, joiner.held_mode) == (7, mode)
    assert torch.equal(joiner.held, result)
    older = StateSpace.load(snap.manifest, snap.buffer)
    del older.meta["runtime"]["held_sync"]
    joiner.restore(older)
    assert joiner.held_version == 7 and joiner.held_mode is None
