"""The slow-links bench's tasks, shared by the testbed worker and the in-process tuning.

- ``digits``: scikit-learn's digits (1,797 8x8 images), split once (a fixed permutation, the
  same for every seed) into 360 test, 360 validation and 1,077 training digits; a
  64-512-256-10 MLP (167k parameters, 0.67 MB of float32 gradients).
- ``chartf``: the character transformer of :mod:`chaos_edge.examples.chartf` (114k
  parameters, 0.46 MB of float32 gradients) on Python's help texts, the adaptive bench's
  model and text. The example holds out the text's last tenth; here its first half is the
  validation split and its second half the test split, each read as fixed windows. A sample
  is a window of 32 characters; the loss is in nats per character, the accuracy that of the
  next character.

A *seed* sets the model's initial weights and every node's batch order, not the split: the
test set is one set for every run, and the validation set that hyper-parameters are chosen
on never overlaps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TEST, VAL = 360, 360
SPLIT_SEED = 0
CHARS, CONTEXT = 48_000, 32  # the adaptive bench's text and window


@dataclass(frozen=True)
class Digits:
    """The task's tensors: features ``x``, labels ``y`` and the three splits' indices."""

    x: Any
    y: Any
    train: Any
    val: Any
    test: Any

    @classmethod
    def load(cls) -> Digits:
        import torch

        from chaos_edge.examples.digits import load

        x, y = load()
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
        return cls(x, y, order[VAL + TEST:], order[TEST:TEST + VAL], order[:TEST])

    def batch(self, gen: Any, size: int) -> tuple[Any, Any]:
        """``size`` training samples drawn with ``gen`` (with replacement)."""
        import torch

        idx = self.train[torch.randint(len(self.train), (size,), generator=gen)]
        return self.x[idx], self.y[idx]

    def evaluate(self, model: Any, split: str) -> tuple[float, float]:
        """(cross-entropy loss, accuracy) of ``model`` on ``split`` ("val" or "test")."""
        import torch

        idx = self.val if split == "val" else self.test
        with torch.no_grad():
            out = model(self.x[idx])
            loss = float(torch.nn.functional.cross_entropy(out, self.y[idx]))
            acc = float((out.argmax(1) == self.y[idx]).float().mean())
        return loss, acc

    def model(self, seed: int) -> Any:
        """The MLP, initialised from ``seed``."""
        import torch

        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 10))

    def loss(self, model: Any, x: Any, y: Any) -> Any:
        import torch

        return torch.nn.functional.cross_entropy(model(x), y)


@dataclass(frozen=True)
class CharText:
    """The help texts as token ids: ``train``, and the held-out tenth cut into ``val`` and
    ``test``; ``data``: the example's own record (vocabulary, window)."""

    data: Any
    val: Any
    test: Any

    @classmethod
    def load(cls) -> CharText:
        from chaos_edge.examples import chartf

        data = chartf.load(CHARS, CONTEXT)
        half = len(data.val) // 2
        return cls(data, data.val[:half], data.val[half:])

    def batch(self, gen: Any, size: int) -> tuple[Any, Any]:
        """``size`` training windows drawn with ``gen`` (with replacement)."""
        import torch

        from chaos_edge.examples import chartf

        return chartf.batch(self.data, torch.randint(self.data.n_train, (size,), generator=gen))

    def evaluate(self, model: Any, split: str) -> tuple[float, float]:
        """(loss in nats per character, next-character accuracy) of ``model`` on ``split``
        ("val" or "test"), over windows every ``chartf.EVAL_STRIDE`` characters."""
        from chaos_edge.examples import chartf

        ids = self.val if split == "val" else self.test
        return chartf.evaluate(model, self.data._replace(val=ids))

    def model(self, seed: int) -> Any:
        """The transformer, initialised from ``seed``."""
        import torch

        from chaos_edge.examples import chartf

        torch.manual_seed(seed)
        return chartf.CharTransformer(len(self.data.vocab), self.data.context)

    def loss(self, model: Any, x: Any, y: Any) -> Any:
        from chaos_edge.examples import chartf

        return chartf.loss_of(model, x, y)


Task = Digits | CharText
TASKS: dict[str, type[Digits] | type[CharText]] = {"digits": Digits, "chartf": CharText}


def load(name: str) -> Task:
    """The task called ``name`` (one of :data:`TASKS`), its data loaded."""
    return TASKS[name].load()


def batch_generator(seed: int, node_index: int) -> Any:
    """Node ``node_index``'s batch order under ``seed`` (``nN`` is node N)."""
    import torch

    return torch.Generator().manual_seed(100_000 * seed + 1000 + node_index)
