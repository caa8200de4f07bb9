"""Compressed gradients end to end: real mosquitto, three chaosd with ``[training] wire``, and
their workers, through a scale-out. Every node that committed a step holds the same state
digest at it, and the loss falls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(150)


@pytest.mark.parametrize("wire", ["int8"])
def test_compressed_training_keeps_every_member_identical(
    run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wire: str,
) -> None:
    monkeypatch.setenv("CHAOS_WORKER_LOG", "INFO")  # the worker says which format it uses
    r = run(3, config=f'[training]\nwire = "{wire}"\n')
    n1, n2, n3 = r.c.node_ids
    for node in (n1, n2):
        r.join(node)
        r.c.wait(lambda node=node: r.active([node]), 60, f"{node} active")
    r.advance([n1, n2], 20)
    r.join(n3)  # scale-out while the others train on compressed gradients
    r.c.wait(lambda: r.active([n1, n2, n3]), 60, f"{n3} active")
    r.advance([n1, n2, n3], 30)
    assert r.assert_consistent() >= 30
    r.assert_loss_falls(n1)
    logs = [p.read_text(errors="replace") for p in tmp_path.rglob("worker.log")]
    assert len(logs) == 3
    assert all(f"rounds travel as {wire}" in text for text in logs)
