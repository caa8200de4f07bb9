"""Capture/restore of the training state: bit-identity, RNG continuity, corruption, bad input."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from chaos_edge.replication.errors import CorruptStateError, ManifestError
from chaos_edge.replication.manifest import Manifest, blocks_to_ranges, verify_buffer, verify_range
from chaos_edge.replication.state import StateSpace, state_digest

pytestmark = pytest.mark.timeout(120)

BLOCK = 4096  # small blocks so that a tiny model spans many


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )


def _trained(steps: int = 3) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
    return model, opt


def _fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(123)  # different weights and RNG: restore must overwrite both
    model = _model()
    return model, torch.optim.Adam(model.parameters(), lr=0.5)


def _draws() -> tuple[list[float], list[float], list[float]]:
    return torch.rand(5).tolist(), np.random.rand(5).tolist(), [random.random() for _ in range(5)]


def test_round_trip_is_bit_identical_and_rng_continues() -> None:
    model, opt = _trained()
    np.random.seed(7)
    random.seed(7)
    runtime = {"step": 3, "epoch": 1, "loader": {"index": 24}, "hp": {"lr": 1e-2}}
    state = StateSpace.capture(model, opt, runtime, block_size=BLOCK)
    source_digest = state_digest(model, opt)
    source_draws = _draws()

    wire = Manifest.from_json(state.manifest.to_json())  # it crosses the network as JSON
    dst_model, dst_opt = _fresh()
    got = StateSpace.restore(dst_model, dst_opt, wire, bytes(state.buffer))

    assert got == runtime
    assert wire.version == 3
    assert state_digest(dst_model, dst_opt) == source_digest
    assert dst_opt.param_groups[0]["betas"] == (0.8, 0.95)
    assert _draws() == source_draws
    # Training continues in lockstep: the same batch gives the same next state.
    batch = torch.randn(8, 16)
    for m, o in ((model, opt), (dst_model, dst_opt)):
        o.zero_grad()
        m(batch).pow(2).mean().backward()
        o.step()
    assert state_digest(dst_model, dst_opt) == state_digest(model, opt)


def test_manifest_layout_is_contiguous_and_planner_ready() -> None:
    model, opt = _trained()
    state = StateSpace.capture(model, opt, {"step": 3}, block_size=BLOCK)
    m = state.manifest
    assert len(state.buffer) == m.total_bytes == sum(m.segments())
    names = [e.name for e in m.entries]
    assert "model/0.weight" in names and "optim/0/exp_avg_sq" in names and "optim/0/step" in names
    assert names[-1] == "meta"
    json.dumps(m.to_dict())  # JSON-serialisable


def test_corrupt_and_short_blocks_are_detected() -> None:
    model, opt = _trained()
    state = StateSpace.capture(model, opt, {"step": 3}, block_size=BLOCK)
    m = state.manifest
    assert m.num_blocks >= 3
    good = bytes(state.buffer)
    assert verify_range(m, 0, good) == []
    bad = bytearray(good)
    bad[BLOCK + 5] ^= 0xFF
    assert verify_buffer(m, bad) == [1]
    assert blocks_to_ranges(m, [1]) == [(BLOCK, BLOCK)]
    # A range holding blocks 1 and 2 that arrived short: block 2 is missing.
    assert verify_range(m, BLOCK, good[BLOCK : 2 * BLOCK + 10], length=2 * BLOCK) == [2]
    assert verify_range(m, BLOCK, bad[BLOCK : 3 * BLOCK]) == [1]
    # Blocks only partly inside a range are left to verify_buffer.
    assert verify_range(m, 10, bad[10 : 2 * BLOCK]) == [1]
    assert verify_range(m, BLOCK + 10, bad[BLOCK + 10 : 3 * BLOCK]) == []
    dst_model, dst_opt = _fresh()
    before = state_digest(dst_model, dst_opt)
    with pytest.raises(CorruptStateError) as info:
        StateSpace.restore(dst_model, dst_opt, m, bad)
    assert info.value.bad_blocks == [1]
    with pytest.raises(CorruptStateError):
        StateSpace.restore(dst_model, dst_opt, m, good[:-1])
    assert state_digest(dst_model, dst_opt) == before  # nothing was loaded


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(format="other/9"),
        lambda d: d.pop("entries"),
        lambda d: d.update(total_bytes=d["total_bytes"] + 1),
        lambda d: d["blocks"].pop(),
        lambda d: d["blocks"].__setitem__(0, "zz"),
        lambda d: d["entries"][0].update(offset=4),
        lambda d: d["entries"][0].update(dtype="float128"),
        lambda d: d["entries"][0].update(shape=[3, 3]),
        lambda d: d["entries"].append(dict(d["entries"][0])),
    ],
)
def test_bad_manifest_is_rejected(mutate: object) -> None:
    model, opt = _trained(1)
    data = json.loads(
        StateSpace.capture(model, opt, {"step": 1}, block_size=BLOCK).manifest.to_json()
    )
    mutate(data)  # type: ignore[operator]
    with pytest.raises(ManifestError):
        Manifest.from_dict(data)


def test_not_json_and_wrong_model_are_rejected() -> None:
    with pytest.raises(ManifestError):
        Manifest.from_json("{not json")
    model, opt = _trained(1)
    state = StateSpace.capture(model, opt, {"step": 1}, block_size=BLOCK)
    other = torch.nn.Linear(2, 2)
    with pytest.raises(ManifestError):
        StateSpace.restore(
            other, torch.optim.Adam(other.parameters()), state.manifest, state.buffer
        )
    with pytest.raises(ManifestError):
        StateSpace.capture(model, opt, {"step": 1, "bad": object()})
