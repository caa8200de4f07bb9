"""Train a small character-level transformer on Python's own help texts.

The script ships in the package; read it at ``chaos_edge/examples/chartf.py``. This file only runs
it from a checkout:

    chaosctl join -- python examples/chartf.py --epochs 4 --global-batch 128
    chaosctl join -- python -m chaos_edge.examples.chartf --epochs 4 --global-batch 128   # the same
"""

import sys

from chaos_edge.examples.chartf import main

if __name__ == "__main__":
    sys.exit(main())
