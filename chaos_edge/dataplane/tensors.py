"""Flatten a model's gradients into one all-reduce buffer and back, and digest results."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch


def flatten_grads(params: Iterable[torch.Tensor], out: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """Concatenate the ``.grad`` of ``params`` into one flat float32 CPU tensor.

    A parameter without a gradient contributes zeros, so every node's buffer has the same
    layout whatever its local batch touched. With ``out`` (a float32 CPU tensor of the right
    size) the result is written there: a training loop that reuses it saves allocating, and
    the kernel zeroing, a buffer the size of the model every step.
    """
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1) for p in params
    ]
    if not parts:
        return torch.zeros(0, dtype=torch.float32)
    cpu = [t.to(device="cpu", dtype=torch.float32) for t in parts]
    if out is None:
        return torch.cat(cpu)
    return torch.cat(cpu, out=out)


def unflatten_into(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` into each parameter's ``.grad`` (created if None).

    Raises:
        ValueError: ``flat`` does not have exactly as many elements as ``params``.
    """
    need = sum(p.numel() for p in params)
    if flat.numel() != need:
        raise ValueError(f"flat buffer has {flat.numel()} elements, parameters need {need}")
    offset = 0
    for p in params:
        view = flat[offset : offset + p.numel()].view_as(p).to(device=p.device, dtype=p.dtype)
        if p.grad is None:
            p.grad = view.clone()
        else:
            p.grad.copy_(view)
        offset += p.numel()


def digest(values: Any) -> str:
    """SHA-256 of a numpy array's or tensor's raw bytes (for bit-identity checks)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().contiguous().numpy()
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()
