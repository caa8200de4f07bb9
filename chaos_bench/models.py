"""The paper's models as tensor lists, and synthetic states of their sizes, for every bench.

The tensor names, shapes and dtypes come from ``data/paper_models.json``, shipped inside the
package (read with :mod:`importlib.resources`), so the benches run from an installed wheel
without the repository or any download. ``synth-M`` names one float32 tensor of M MiB.
"""

from __future__ import annotations

import functools
import json
import math
import mmap
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from chaos_edge.replication.manifest import Entry, Manifest, block_digests

ITEMSIZE = {"float32": 4, "float16": 2, "int64": 8}
MIB = 1 << 20


@functools.cache
def paper_models() -> dict[str, Any]:
    """The packaged model table: name -> ``{"tensors": [...], "buffers": [...], ...}``."""
    text = (resources.files("chaos_bench") / "data" / "paper_models.json").read_text()
    models: dict[str, Any] = json.loads(text)["models"]
    return models


def model_names() -> list[str]:
    """The paper's models, smallest tensor count first as listed in the data file."""
    return list(paper_models())


def model_entries(name: str) -> list[Entry]:
    """The model's tensors (parameters, then buffers) laid out back to back.

    Raises:
        ValueError: ``name`` is neither a paper model nor ``synth-M`` with a positive M.
    """
    if name.startswith("synth-"):
        try:
            n = int(float(name[6:]) * MIB) // 4 * 4
        except ValueError:
            n = 0
        if n <= 0:
            raise ValueError(f"bad synthetic model {name!r}: use synth-MIB, e.g. synth-64")
        return [Entry("synthetic", "float32", (n // 4,), 0, n)]
    models = paper_models()
    if name not in models:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(models)} or synth-MIB")
    entries, off = [], 0
    for t in models[name]["tensors"] + models[name].get("buffers", []):
        n = math.prod(t["shape"]) * ITEMSIZE[t["dtype"]]
        entries.append(Entry(t["name"], t["dtype"], tuple(t["shape"]), off, n))
        off += n
    return entries


def tensor_sizes(name: str) -> list[int]:
    """Byte size of each of the model's tensors (what the planner splits)."""
    return [e.nbytes for e in model_entries(name)]


def map_state(path: str | Path) -> memoryview:
    """A state file, mapped read-only (the page cache holds one copy for every process)."""
    with open(path, "rb") as f:
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def make_state(name: str, path: Path, seed: int) -> Manifest:
    """Write synthetic bytes of the model's size to ``path`` and its manifest beside it
    (``NAME.manifest.json``); return the manifest."""
    entries = model_entries(name)
    total = entries[-1].offset + entries[-1].nbytes
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        for i in range(0, total, 64 * MIB):
            f.write(rng.integers(0, 256, min(64 * MIB, total - i), dtype=np.uint8).tobytes())
    data = map_state(path)
    blocks = block_digests(data, MIB)
    data.release()
    manifest = Manifest(0, total, MIB, blocks, tuple(entries))
    path.with_suffix(".manifest.json").write_text(manifest.to_json())
    return manifest
