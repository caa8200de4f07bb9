"""Train a small MLP on scikit-learn's bundled digits across a Chaos cluster.

The script ships in the package, so that an installed chaos-edge (and ``chaosctl demo``) has
it too; read it at ``chaos_edge/examples/digits.py``. This file only runs it from a checkout:

    chaosctl join -- python examples/digits.py --steps 500
    chaosctl join -- python -m chaos_edge.examples.digits --steps 500   # the same
"""

import sys

from chaos_edge.examples.digits import main

if __name__ == "__main__":
    sys.exit(main())
