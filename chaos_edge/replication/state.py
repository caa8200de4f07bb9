"""Training state as one versioned byte space: capture, restore, and a digest for bit-identity.

Layout, in byte order: ``model/<name>`` for every entry of ``model.state_dict()`` (parameters
and persistent buffers), ``optim/<index>/<key>`` for every tensor of the optimizer state,
``extra/<name>`` for every other tensor the caller hands in (the tensors of registered objects
such as an EMA model, a held round result), optionally ``rng/torch`` (and ``rng/cuda/<i>`` when
CUDA is up) and ``rng/numpy``, and last ``meta``: one JSON document (sorted keys) with the
runtime dict (registered objects' non-tensor state among it), the optimizer's type, param
groups and non-tensor state, and the numpy and Python RNG states if carried. Everything,
metadata included, lives in the checksummed byte space, so a receiver verifies every byte
before it loads anything.

Memory: :meth:`StateSpace.capture` makes one contiguous copy of the state (``total_bytes``).
Tensors are copied straight into it; the only other allocations are a temporary contiguous copy
of a non-contiguous tensor (one at a time) and the JSON document. :meth:`StateSpace.restore`
copies each entry out of the buffer once, into the model's own tensors and fresh optimizer
tensors; it never holds a second copy of the whole state.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from chaos_edge.replication.errors import CorruptStateError, ManifestError
from chaos_edge.replication.manifest import (
    BLOCK_SIZE,
    RAW_DTYPE,
    Entry,
    Manifest,
    block_digests,
    verify_buffer,
)
from chaos_edge.replication.tree import TreeError, decode, dumps, encode

Buffer = bytes | bytearray | memoryview


def _dumps(value: Any) -> bytes:
    return dumps(encode(value))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor as a flat uint8 view (a copy only if it is not contiguous)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def tensor_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 extra: Sequence[tuple[str, torch.Tensor]] = ()) -> int:
    """Bytes of the model's, the optimizer's and the extra tensors: what a snapshot copies,
    less the small metadata (cheap: nothing is copied)."""
    tensors = [*model.state_dict().values(),
               *(v for st in optimizer.state.values() for v in st.values()
                 if isinstance(v, torch.Tensor)), *(t for _, t in extra)]  # fmt: skip
    return sum(t.numel() * t.element_size() for t in tensors)


Extra = Sequence[tuple[str, torch.Tensor]]


def _gather(
    model_state: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer,
    runtime: Mapping[str, Any], extra: Extra, rng: bool,
) -> tuple[list[tuple[str, torch.Tensor]], bytes]:  # fmt: skip
    """All tensors of the state in layout order, and the JSON metadata."""
    tensors = [(f"model/{k}", v) for k, v in model_state.items()]
    osd = optimizer.state_dict()
    other: dict[str, dict[str, Any]] = {}
    for idx, pstate in osd["state"].items():
        for key, val in pstate.items():
            if isinstance(val, torch.Tensor):
                tensors.append((f"optim/{idx}/{key}", val))
            else:
                other.setdefault(str(idx), {})[key] = val
    tensors += [(f"extra/{name}", t) for name, t in extra]
    meta: dict[str, Any] = {
        "runtime": dict(runtime),
        "optimizer": {"type": _type_name(optimizer), "param_groups": osd["param_groups"],
                      "state": other},
    }  # fmt: skip
    if rng:
        tensors.append(("rng/torch", torch.get_rng_state()))
        if torch.cuda.is_available():
            tensors += [(f"rng/cuda/{i}", s) for i, s in enumerate(torch.cuda.get_rng_state_all())]
        np_name, np_keys, np_pos, np_gauss, np_cached = np.random.get_state()
        tensors.append(("rng/numpy", torch.from_numpy(np.asarray(np_keys, dtype=np.uint32).copy())))
        meta["rng"] = {"numpy": [np_name, int(np_pos), int(np_gauss), float(np_cached)],
                       "python": random.getstate()}
    try:
        return tensors, _dumps(meta)
    except TreeError as exc:
        raise ManifestError(f"{exc}; keep runtime values to JSON types") from None


def _type_name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


@dataclass(frozen=True)
class Loaded:
    """A verified state, parsed but not loaded into anything yet.

    Attributes:
        model: The model's state dict.
        optimizer: The optimizer's state dict, and its type name under ``"type"``.
        extra: The extra tensors by name.
        rng: The RNG states.
        meta: The JSON metadata (``runtime`` among it).
    """

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    extra: dict[str, torch.Tensor]
    rng: dict[str, torch.Tensor]
    meta: dict[str, Any]

    @property
    def runtime(self) -> dict[str, Any]:
        """The runtime dict given to :meth:`StateSpace.capture`."""
        return dict(self.meta["runtime"])

    def fit_error(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
        """What keeps this state from loading into ``model`` and ``optimizer`` (one line), or
        None if it fits. Nothing is loaded."""
        ours = model.state_dict()
        missing = sorted(set(self.model) - set(ours))
        unexpected = sorted(set(ours) - set(self.model))
        if missing or unexpected:
            return ("the model differs: " + "; ".join(
                ([f"the cluster's has {', '.join(missing[:3])}"] if missing else []) +
                ([f"this script's has {', '.join(unexpected[:3])}"] if unexpected else [])))
        for k, t in self.model.items():
            mine = ours[k]
            if tuple(t.shape) != tuple(mine.shape) or t.dtype != mine.dtype:
                return (f"model entry {k!r} is {_dtype_name(t.dtype)}{list(t.shape)} in the "
                        f"cluster, {_dtype_name(mine.dtype)}{list(mine.shape)} here")
        theirs = self.optimizer.get("type")
        if theirs and theirs != _type_name(optimizer):
            return f"the cluster's optimizer is a {theirs}, this script's a {_type_name(optimizer)}"
        groups = [len(g["params"]) for g in self.optimizer["param_groups"]]
        here = [len(g["params"]) for g in optimizer.param_groups]
        if groups != here:
            return (f"the optimizer's parameter groups hold {groups} parameters in the cluster, "
                    f"{here} here")
        return None

    def apply(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load the model, the optimizer and the RNG states.

        Raises:
            ManifestError: The state does not fit (check :meth:`fit_error` first to load
                nothing at all in that case).
        """
        try:
            model.load_state_dict(self.model, strict=True)
            optimizer.load_state_dict({"state": self.optimizer["state"],
                                       "param_groups": self.optimizer["param_groups"]})
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ManifestError(f"state does not fit this model/optimizer: {exc}") from None
        if "rng" not in self.meta:
            return  # a state captured without the RNGs: this process keeps its own
        torch.set_rng_state(self.rng["torch"])
        if torch.cuda.is_available():
            cuda = [self.rng[k] for k in sorted(self.rng) if k.startswith("cuda/")]
            if cuda:
                torch.cuda.set_rng_state_all(cuda)
        name, pos, has_gauss, cached = self.meta["rng"]["numpy"]
        np.random.set_state((name, self.rng["numpy"].numpy(), pos, has_gauss, cached))
        random.setstate(self.meta["rng"]["python"])


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
        *,
        model_state: Mapping[str, torch.Tensor] | None = None,
        extra: Extra = (),
        rng: bool = True,
        hashed: bool = True,
    ) -> StateSpace:
        """Flatten model, optimizer and runtime state into one checksummed byte space.

        Args:
            model: The model (parameters and persistent buffers are captured).
            optimizer: Its optimizer (tensor state, step counts, param groups).
            runtime: JSON-serialisable runtime state: ``step`` (the version), epoch,
                hyper-parameters, data-loader position, ... RNG states are added here.
            block_size: Checksum block size.
            model_state: The model's state dict to capture instead of ``model.state_dict()``
                (the Trainer passes its synchronised copy of the buffers).
            extra: More named tensors (``extra/<name>`` entries).
            rng: Whether to carry this process's RNG states. The Trainer does not: each
                member's RNG is its own (its dropout masks, its augmentations), so the sources'
                snapshots would differ in them and could not be pulled from several at once,
                and a joiner that copied one source's stream would repeat that source's noise.
            hashed: Whether to compute the block digests now. A durable snapshot copies on
                the step's path and hashes on its writer's thread (:meth:`hashed`).

        Returns:
            The state; ``buffer`` is one copy of it (see the module docstring on memory).
        """
        sd = model.state_dict() if model_state is None else model_state
        tensors, meta = _gather(sd, optimizer, runtime, extra, rng)
        entries: list[Entry] = []
        offset = 0
        for name, t in tensors:
            nbytes = t.numel() * t.element_size()
            entries.append(Entry(name, _dtype_name(t.dtype), tuple(t.shape), offset, nbytes))
            offset += nbytes
        entries.append(Entry("meta", RAW_DTYPE, (len(meta),), offset, len(meta)))
        total = offset + len(meta)
        buffer = bytearray(total)
        flat = torch.frombuffer(buffer, dtype=torch.uint8) if total else torch.empty(0)
        for (_, t), e in zip(tensors, entries, strict=False):
            if e.nbytes:
                flat[e.offset : e.offset + e.nbytes].copy_(_tensor_bytes(t))
        buffer[offset:] = meta
        manifest = Manifest(
            int(runtime.get("step", 0)), total, block_size,
            block_digests(buffer, block_size) if hashed else (), tuple(entries),
        )  # fmt: skip
        return cls(manifest, buffer)

    def hashed(self) -> StateSpace:
        """This state with its block digests, computed now if :meth:`capture` left them out."""
        if self.manifest.blocks or not self.manifest.total_bytes:
            return self
        blocks = block_digests(self.buffer, self.manifest.block_size)
        return StateSpace(dataclasses.replace(self.manifest, blocks=blocks), self.buffer)

    @staticmethod
    def load(manifest: Manifest, buffer: Buffer) -> Loaded:
        """Verify every block, then parse the state (each entry copied out once).

        Raises:
            CorruptStateError: If a block is corrupt or the buffer is short.
        """
        manifest.validate()
        bad = verify_buffer(manifest, buffer)
        if bad:
            raise CorruptStateError(f"{len(bad)} corrupt or missing blocks; fetch them again", bad)
        raw = np.frombuffer(memoryview(buffer).cast("B"), dtype=np.uint8)
        parts: dict[str, dict[str, torch.Tensor]] = {"model": {}, "extra": {}, "rng": {}}
        optim_state: dict[int, dict[str, Any]] = {}
        meta: dict[str, Any] = {}
        for e in manifest.entries:
            chunk = raw[e.offset : e.offset + e.nbytes]
            if e.dtype == RAW_DTYPE:
                meta = decode(json.loads(chunk.tobytes()))
                continue
            t = torch.from_numpy(chunk.copy()).view(getattr(torch, e.dtype)).reshape(e.shape)
            kind, _, name = e.name.partition("/")
            if kind == "optim":
                idx, _, key = name.partition("/")
                optim_state.setdefault(int(idx), {})[key] = t
            else:
                parts.get(kind, parts["rng"])[name] = t
        opt_meta = meta["optimizer"]
        for idx, more in opt_meta["state"].items():
            optim_state.setdefault(int(idx), {}).update(more)
        optimizer = {"type": opt_meta.get("type"), "state": optim_state,
                     "param_groups": opt_meta["param_groups"]}  # fmt: skip
        return Loaded(parts["model"], optimizer, parts["extra"], parts["rng"], meta)

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
            ManifestError: If the state does not fit this model and optimizer; nothing is loaded.
        """
        loaded = StateSpace.load(manifest, buffer)
        why = loaded.fit_error(model, optimizer)
        if why is not None:
            raise ManifestError(f"state does not fit this model/optimizer: {why}")
        loaded.apply(model, optimizer)
        return loaded.runtime


def state_digest(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    model_state: Mapping[str, torch.Tensor] | None = None,
    extra: Extra = (),
    meta: Any = None,
) -> str:
    """SHA-256 over parameters, buffers, optimizer state, and the extra tensors and JSON
    metadata given (tensors by name, dtype, shape and bytes). RNG states are left out: they
    are each member's own."""
    return state_digest_bytes(model, optimizer, model_state=model_state, extra=extra,
                              meta=meta).hex()


def state_digest_bytes(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    model_state: Mapping[str, torch.Tensor] | None = None,
    extra: Extra = (),
    meta: Any = None,
) -> bytes:
    """:func:`state_digest` as 32 raw bytes (what the agreement carries)."""
    h = hashlib.sha256()

    def add(name: str, value: Any) -> None:
        h.update(name.encode() + b"\0")
        if isinstance(value, torch.Tensor):
            h.update(f"{value.dtype}{tuple(value.shape)}".encode())
            h.update(_tensor_bytes(value).numpy().data)  # hashed in place, no copy
        else:
            h.update(_dumps(value))

    for k, v in (model.state_dict() if model_state is None else model_state).items():
        add(f"model/{k}", v)
    osd = optimizer.state_dict()
    for idx in sorted(osd["state"]):
        for key in sorted(osd["state"][idx]):
            add(f"optim/{idx}/{key}", osd["state"][idx][key])
    add("param_groups", osd["param_groups"])
    for name, t in sorted(extra, key=lambda e: e[0]):
        add(f"extra/{name}", t)
    if meta is not None:
        add("meta", meta)
    return h.digest()
