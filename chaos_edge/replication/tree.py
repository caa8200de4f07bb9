"""A JSON codec for state trees: the nested dicts and lists that ``state_dict()`` returns.

JSON alone loses three things a ``load_state_dict()`` may rely on: tuples (they come back as
lists), non-string dict keys (an optimizer's state is keyed by int) and tensors. Tuples and
dicts with other keys get a tagged form; each tensor is handed to ``on_tensor``, which stores
it elsewhere (in the state's byte space) and returns the key that stands for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

_TUPLE, _ITEMS, _TENSOR, _FLOAT = "__tuple__", "__items__", "__tensor__", "__float__"


class TreeError(TypeError):
    """A value in a state tree that has no JSON form; the message names its path."""


def encode(value: Any, on_tensor: Callable[[str, torch.Tensor], str] | None = None,
           path: str = "") -> Any:
    """``value`` as JSON-able data.

    Args:
        value: The tree.
        on_tensor: Called with (path, tensor) for each tensor; returns its stand-in key. Without
            it a tensor is an error.
        path: Where ``value`` sits, for error messages.

    Raises:
        TreeError: A leaf that is neither a JSON scalar, a numpy scalar nor a tensor.
    """
    if isinstance(value, torch.Tensor):
        if on_tensor is None:
            raise TreeError(f"{path or 'value'} is a tensor, which needs a byte space")
        return {_TENSOR: on_tensor(path, value)}
    if isinstance(value, tuple):
        return {_TUPLE: [encode(v, on_tensor, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, on_tensor, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value) and not ({_TUPLE, _ITEMS, _TENSOR, _FLOAT}
                                                           & set(value)):  # fmt: skip
            return {k: encode(v, on_tensor, f"{path}[{k!r}]") for k, v in value.items()}
        items = []
        for k, v in value.items():
            if k is not None and not isinstance(k, (str, int, float, bool)):
                raise TreeError(f"{path or 'value'} has a key of type {type(k).__name__}")
            items.append([k, encode(v, on_tensor, f"{path}[{k!r}]")])
        return {_ITEMS: items}
    if isinstance(value, np.generic):
        value = value.item()  # numpy scalars: load_state_dict takes the Python value
    if isinstance(value, float) and not math.isfinite(value):
        return {_FLOAT: repr(value)}  # inf and nan: strict JSON has no literal for them
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TreeError(f"{path or 'value'} is a {type(value).__module__}.{type(value).__qualname__}, "
                    "which has no JSON form")


def decode(doc: Any, tensors: Mapping[str, torch.Tensor] | None = None) -> Any:
    """Inverse of :func:`encode`; ``tensors`` maps the stand-in keys back to tensors."""
    if isinstance(doc, list):
        return [decode(v, tensors) for v in doc]
    if not isinstance(doc, dict):
        return doc
    if set(doc) == {_TENSOR}:
        if tensors is None or doc[_TENSOR] not in tensors:
            raise KeyError(f"the state names tensor {doc[_TENSOR]!r} but does not carry it")
        return tensors[doc[_TENSOR]]
    if set(doc) == {_TUPLE}:
        return tuple(decode(v, tensors) for v in doc[_TUPLE])
    if set(doc) == {_ITEMS}:
        return {k: decode(v, tensors) for k, v in doc[_ITEMS]}
    if set(doc) == {_FLOAT}:
        return float(doc[_FLOAT])
    return {k: decode(v, tensors) for k, v in doc.items()}


def dumps(doc: Any) -> bytes:
    """Canonical bytes of encoded data (sorted keys): equal trees give equal bytes."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
