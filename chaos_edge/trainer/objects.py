"""The objects a script registers with the Trainer beyond the model and the optimizer.

LR schedulers, a ``GradScaler``, an EMA model, samplers, the script's own counters: anything
with ``state_dict()``/``load_state_dict()``, or a plain JSON value. They travel in the state's
byte space: their tensors as ``extra/obj/<name>/<n>`` entries, the rest of each state dict
(and each plain value) in the runtime JSON, with the object's type so that a joiner with
another scheduler is refused by name rather than loaded wrongly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from chaos_edge.replication.tree import TreeError, decode, encode
from chaos_edge.trainer.control import StateMismatch, UnserialisableState

JSON_TYPE = "json"  # the type recorded for a plain value
SCALER_NAME = "grad_scaler"


def _stateful(obj: object) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None))


def type_name(obj: object) -> str:
    """The qualified class name recorded for ``obj``."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class Registry:
    """The registered objects, by name; :attr:`values` is the Trainer's ``state`` dict.

    Args:
        objects: Name -> object (``state_dict``/``load_state_dict``) or JSON value.
        scaler: A ``GradScaler`` to register as ``grad_scaler`` too (if not there already).

    Raises:
        UnserialisableState: A name is not a plain string, or an object's state has no
            serial form; the message names the object and the path inside its state.
    """

    def __init__(self, objects: Mapping[str, Any] | None, scaler: Any = None) -> None:
        self.values: dict[str, Any] = dict(objects or {})
        for name in self.values:
            if not isinstance(name, str) or not name or "/" in name:
                raise UnserialisableState(f"state name {name!r} must be a non-empty str "
                                          "without '/'")
        if scaler is not None:
            held = self.values.setdefault(SCALER_NAME, scaler)
            if held is not scaler:
                raise UnserialisableState(f"state {SCALER_NAME!r} is taken by another object "
                                          "than the scaler= given")
        self.capture()  # fail now, at Trainer() time, not at the first join

    def capture(self) -> tuple[list[tuple[str, torch.Tensor]], dict[str, Any]]:
        """The registered state: tensors (``obj/<name>/<n>``) and the JSON document.

        Tensors are not copied (the byte space copies them once when it is laid out).
        """
        tensors: list[tuple[str, torch.Tensor]] = []
        doc: dict[str, Any] = {}
        for name in sorted(self.values):
            obj = self.values[name]

            def keep(path: str, t: torch.Tensor, name: str = name,
                     n: list[int] = [0]) -> str:  # noqa: B006 - one counter per object
                key = f"obj/{name}/{n[0]}"
                n[0] += 1
                tensors.append((key, t.detach()))
                return key

            try:
                if _stateful(obj):
                    doc[name] = {"type": type_name(obj),
                                 "state": encode(obj.state_dict(), keep, "state_dict()")}
                else:
                    doc[name] = {"type": JSON_TYPE, "state": encode(obj, None, "value")}
            except TreeError as exc:
                what = type_name(obj) if _stateful(obj) else "plain value"
                raise UnserialisableState(
                    f"state {name!r} ({what}) cannot be replicated: {exc}; register objects "
                    "with state_dict()/load_state_dict() or JSON values") from None
        return tensors, doc

    def mismatch(self, doc: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]
                 ) -> str | None:
        """What differs between the cluster's registered state and ours (one line), or None."""
        theirs, ours = set(doc), set(self.values)
        if theirs != ours:
            parts = []
            if theirs - ours:
                parts.append(f"the cluster registers {sorted(theirs - ours)}")
            if ours - theirs:
                parts.append(f"this script registers {sorted(ours - theirs)}")
            return "the registered state differs: " + " and ".join(parts)
        mine, _ = self.capture()
        local = dict(mine)
        for name in sorted(doc):
            obj = self.values[name]
            want = type_name(obj) if _stateful(obj) else JSON_TYPE
            if doc[name].get("type") != want:
                return (f"state {name!r} is a {doc[name].get('type')} in the cluster, "
                        f"a {want} here")
        for key, t in tensors.items():
            if not key.startswith("obj/"):
                continue
            if key not in local:
                return f"state tensor {key!r} of the cluster has no counterpart here"
            here = local[key]
            if tuple(here.shape) != tuple(t.shape) or here.dtype != t.dtype:
                return (f"state tensor {key!r} is {t.dtype}{list(t.shape)} in the cluster, "
                        f"{here.dtype}{list(here.shape)} here")
        return None

    def restore(self, doc: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
        """Load the cluster's registered state (check :meth:`mismatch` first).

        Objects load in place; a plain value replaces ``values[name]`` (a dict or list is
        updated in place, so a reference the script holds sees the cluster's values).

        Raises:
            StateMismatch: An object's ``load_state_dict`` refused the state.
        """
        for name in sorted(doc):
            state = decode(doc[name]["state"], tensors)
            obj = self.values[name]
            if _stateful(obj):
                try:
                    obj.load_state_dict(state)
                except (RuntimeError, ValueError, KeyError, TypeError) as exc:
                    raise StateMismatch(f"state {name!r} ({type_name(obj)}) does not load the "
                                        f"cluster's state: {exc}") from None
            elif isinstance(obj, dict) and isinstance(state, dict):
                obj.clear()
                obj.update(state)
            elif isinstance(obj, list) and isinstance(state, list):
                obj[:] = state
            else:
                self.values[name] = state
