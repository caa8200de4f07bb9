"""Test worker: the package's training worker (:mod:`chaos_bench.stall.worker`), by path.

The training tests start it as ``python tests/training/_worker.py ARGS`` (the stall bench as
``python -m chaos_bench.stall.worker``); one script, so the tests measure what the bench runs.
Writes one JSON line per committed step to ``--out``: ``{"step", "digest", "loss", ...}``.
``--fault EVENT:INDEX:FROM_STEP`` kills this process with SIGKILL at the first data-plane
hook ``EVENT`` with ``INDEX`` once round ``FROM_STEP`` or later runs (fault injection).
"""

from __future__ import annotations

import sys

from chaos_bench.stall.worker import main

if __name__ == "__main__":
    sys.exit(main())
