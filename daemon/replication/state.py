"""Training state as one versioned byte space: capture, restore, and a digest for bit-identity.

Layout, in byte order: ``model/<name>`` for every entry of ``model.state_dict()`` (parameters
and persistent buffers), ``optim/<index>/<key>`` for every tensor of the optimizer state,
``rng/torch`` (and ``rng/cuda/<i>`` when CUDA is up), ``rng/numpy``, and last ``meta``: one JSON
document (sorted keys) with the runtime dict, the optimizer's param groups and non-tensor state,
and the numpy and Python RNG states. Everything, metadata included, lives in the checksummed
byte space, so a receiver verifies every byte before it loads anything.

Memory: :meth:`StateSpace.capture` makes one contiguous copy of the state (``total_bytes``).
Tensors are copied straight into it; the only other allocations are a temporary contiguous copy
of a non-contiguous tensor (one at a time) and the JSON document. :meth:`StateSpace.restore`
copies each entry out of the buffer once, into the model's own tensors and fresh optimizer
tensors; it never holds a second copy of the whole state.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from daemon.replication.errors import CorruptStateError, ManifestError
from daemon.replication.manifest import (
    BLOCK_SIZE,
    RAW_DTYPE,
    Entry,
    Manifest,
    block_digests,
    verify_buffer,
)

Buffer = bytes | bytearray | memoryview


def _encode(value: Any) -> Any:
    """Make a value JSON-safe, keeping tuples distinguishable from lists."""
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot serialise {type(value).__name__} in the training state")


def _decode(value: Any) -> Any:
    """Inverse of :func:`_encode`."""
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(_decode(v) for v in value["__tuple__"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _dumps(value: Any) -> bytes:
    return json.dumps(_encode(value), sort_keys=True, separators=(",", ":")).encode()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor as a flat uint8 view (a copy only if it is not contiguous)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def tensor_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the model's and the optimizer's tensors: what a snapshot copies, less the
    small metadata (cheap: nothing is copied)."""
    tensors = [*model.state_dict().values(),
               *(v for st in optimizer.state.values() for v in st.values()
                 if isinstance(v, torch.Tensor))]  # fmt: skip
    return sum(t.numel() * t.element_size() for t in tensors)


def _gather(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, runtime: Mapping[str, Any]
) -> tuple[list[tuple[str, torch.Tensor]], bytes]:
    """All tensors of the state in layout order, and the JSON metadata."""
    tensors = [(f"model/{k}", v) for k, v in model.state_dict().items()]
    osd = optimizer.state_dict()
    other: dict[str, dict[str, Any]] = {}
    for idx, pstate in osd["state"].items():
        for key, val in pstate.items():
            if isinstance(val, torch.Tensor):
                tensors.append((f"optim/{idx}/{key}", val))
            else:
                other.setdefault(str(idx), {})[key] = val
    tensors.append(("rng/torch", torch.get_rng_state()))
    if torch.cuda.is_available():
        tensors += [(f"rng/cuda/{i}", s) for i, s in enumerate(torch.cuda.get_rng_state_all())]
    np_name, np_keys, np_pos, np_gauss, np_cached = np.random.get_state()
    tensors.append(("rng/numpy", torch.from_numpy(np.asarray(np_keys, dtype=np.uint32).copy())))
    meta = {
        "runtime": dict(runtime),
        "optimizer": {"param_groups": osd["param_groups"], "state": other},
        "rng": {"numpy": [np_name, int(np_pos), int(np_gauss), float(np_cached)],
                "python": random.getstate()},
    }  # fmt: skip
    try:
        return tensors, _dumps(meta)
    except TypeError as exc:
        raise ManifestError(f"{exc}; keep runtime values to JSON types") from None


@dataclass(frozen=True)
class StateSpace:
    """A captured training state: its manifest and its contiguous byte buffer."""

    manifest: Manifest
    buffer: bytearray

    @classmethod
    def capture(
        cls,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        runtime: Mapping[str, Any],
        block_size: int = BLOCK_SIZE,
    ) -> StateSpace:
        """Flatten model, optimizer and runtime state into one checksummed byte space.

        Args:
            model: The model (parameters and persistent buffers are captured).
            optimizer: Its optimizer (tensor state, step counts, param groups).
            runtime: JSON-serialisable runtime state: ``step`` (the version), epoch,
                hyper-parameters, data-loader position, ... RNG states are added here.
            block_size: Checksum block size.

        Returns:
            The state; ``buffer`` is one copy of it (see the module docstring on memory).
        """
        tensors, meta = _gather(model, optimizer, runtime)
        entries: list[Entry] = []
        offset = 0
        for name, t in tensors:
            nbytes = t.numel() * t.element_size()
            entries.append(Entry(name, _dtype_name(t.dtype), tuple(t.shape), offset, nbytes))
            offset += nbytes
        entries.append(Entry("meta", RAW_DTYPE, (len(meta),), offset, len(meta)))
        total = offset + len(meta)
        buffer = bytearray(total)
        flat = torch.frombuffer(buffer, dtype=torch.uint8)
        for (_, t), e in zip(tensors, entries, strict=False):
            if e.nbytes:
                flat[e.offset : e.offset + e.nbytes].copy_(_tensor_bytes(t))
        buffer[offset:] = meta
        manifest = Manifest(
            int(runtime.get("step", 0)), total, block_size,
            block_digests(buffer, block_size), tuple(entries),
        )  # fmt: skip
        return cls(manifest, buffer)

    @staticmethod
    def restore(
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        manifest: Manifest,
        buffer: Buffer,
    ) -> dict[str, Any]:
        """Verify every block, then load the state back bit-identically and set the RNGs.

        Returns:
            The runtime dict given to :meth:`capture`.

        Raises:
            CorruptStateError: If a block is corrupt or the buffer is short; nothing is loaded.
            ManifestError: If the state does not fit this model and optimizer.
        """
        manifest.validate()
        bad = verify_buffer(manifest, buffer)
        if bad:
            raise CorruptStateError(f"{len(bad)} corrupt or missing blocks; fetch them again", bad)
        raw = np.frombuffer(memoryview(buffer).cast("B"), dtype=np.uint8)
        model_sd: dict[str, torch.Tensor] = {}
        optim_state: dict[int, dict[str, Any]] = {}
        rng: dict[str, torch.Tensor] = {}
        meta: dict[str, Any] = {}
        for e in manifest.entries:
            chunk = raw[e.offset : e.offset + e.nbytes]
            if e.dtype == RAW_DTYPE:
                meta = _decode(json.loads(chunk.tobytes()))
                continue
            t = torch.from_numpy(chunk.copy()).view(getattr(torch, e.dtype)).reshape(e.shape)
            kind, _, name = e.name.partition("/")
            if kind == "model":
                model_sd[name] = t
            elif kind == "optim":
                idx, _, key = name.partition("/")
                optim_state.setdefault(int(idx), {})[key] = t
            else:
                rng[name] = t
        opt_meta = meta["optimizer"]
        for idx, extra in opt_meta["state"].items():
            optim_state.setdefault(int(idx), {}).update(extra)
        try:
            model.load_state_dict(model_sd, strict=True)
            optimizer.load_state_dict(
                {"state": optim_state, "param_groups": opt_meta["param_groups"]}
            )
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ManifestError(f"state does not fit this model/optimizer: {exc}") from None
        torch.set_rng_state(rng["torch"])
        if torch.cuda.is_available():
            cuda = [rng[k] for k in sorted(rng) if k.startswith("cuda/")]
            if cuda:
                torch.cuda.set_rng_state_all(cuda)
        name, pos, has_gauss, cached = meta["rng"]["numpy"]
        np.random.set_state((name, rng["numpy"].numpy(), pos, has_gauss, cached))
        random.setstate(meta["rng"]["python"])
        return dict(meta["runtime"])


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 over parameters, buffers and optimizer state (tensors by name, dtype and bytes)."""
    h = hashlib.sha256()

    def add(name: str, value: Any) -> None:
        h.update(name.encode() + b"\0")
        if isinstance(value, torch.Tensor):
            h.update(f"{value.dtype}{tuple(value.shape)}".encode())
            h.update(_tensor_bytes(value).numpy().tobytes())
        else:
            h.update(_dumps(value))

    for k, v in model.state_dict().items():
        add(f"model/{k}", v)
    osd = optimizer.state_dict()
    for idx in sorted(osd["state"]):
        for key in sorted(osd["state"][idx]):
            add(f"optim/{idx}/{key}", osd["state"][idx][key])
    add("param_groups", osd["param_groups"])
    return h.hexdigest()
