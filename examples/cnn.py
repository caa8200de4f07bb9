"""Train a small CNN with BatchNorm and Dropout on scikit-learn's bundled digits.

The script ships in the package; read it at ``chaos_edge/examples/cnn.py``. This file only runs
it from a checkout:

    chaosctl join -- python examples/cnn.py --epochs 20 --global-batch 128
    chaosctl join -- python -m chaos_edge.examples.cnn --epochs 20 --global-batch 128   # the same
"""

import sys

from chaos_edge.examples.cnn import main

if __name__ == "__main__":
    sys.exit(main())
