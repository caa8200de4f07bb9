"""Complete training scripts that ship with the package, runnable with ``python -m``.

- :mod:`chaos_edge.examples.digits`: an MLP on scikit-learn's bundled digits, one shard per
  node (``pip install 'chaos-edge[examples]'``). ``chaosctl demo`` trains with it.
"""
