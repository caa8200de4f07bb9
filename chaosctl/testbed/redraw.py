"""The bandwidth redraw loop: ``python -m chaosctl.testbed.redraw DIR``.

Every ``redraw_period_s`` it draws a new rate for every data link from the testbed's range (the
paper re-draws 100-1000 Mbit/s every 3 minutes) and applies it with tc. The testbed starts it in
the hub namespace, so it needs no pid file and no owner: teardown kills it with the hub. It
records each round in ``DIR/redraw.json`` (written atomically) and stops by itself once the
testbed's state file is gone.

A manual ``chaosctl testbed shape`` holds until the next round.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from chaosctl.testbed import net as net
from chaosctl.testbed.state import STATE_FILE, TestbedError, TestbedState

_stop = False


def _on_term(_sig: int, _frame: FrameType | None) -> None:
    global _stop
    _stop = True  # only a flag: the loop exits at its next tick


def redraw_once(state: TestbedState, rng: random.Random, round_no: int) -> dict[str, float]:
    """Draw and apply one new rate per link; return ``{"a-b": mbit}``."""
    low, high = state.bw
    rates = {}
    for rec in state.links:
        mbit = float(round(rng.uniform(low, high))) or low
        net.shape(state, rec, mbit)
        rates[f"{rec.a}-{rec.b}"] = mbit
    out = Path(state.dir) / "redraw.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"round": round_no, "at": time.time(), "rates": rates}) + "\n")
    os.replace(tmp, out)
    return rates


def main(argv: list[str] | None = None) -> int:
    """Run the loop for the testbed in ``argv[0]`` until SIGTERM or the testbed is gone."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m chaosctl.testbed.redraw DIR", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    state = TestbedState.load(args[0])
    if state is None or state.redraw_period_s <= 0:
        print(f"no testbed with a redraw period in {args[0]}", file=sys.stderr)
        return 1
    # Seeded apart from the initial draw, so a run's sequence of rates is reproducible.
    rng = random.Random(f"{state.seed}:redraw")
    state_file = Path(state.dir) / STATE_FILE
    next_at = time.monotonic() + state.redraw_period_s
    round_no = 0
    while not _stop and state_file.exists():
        if time.monotonic() >= next_at:
            round_no += 1
            try:
                rates = redraw_once(state, rng, round_no)
                print(f"round {round_no}: {json.dumps(rates)}", flush=True)
            except TestbedError as exc:
                print(f"round {round_no} failed: {exc}", flush=True)
            next_at += state.redraw_period_s
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
