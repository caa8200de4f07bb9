"""The slow-links bench's task, shared by the testbed worker and the in-process tuning.

scikit-learn's digits (1,797 8x8 images), split once (a fixed permutation, the same for every
seed) into 360 test, 360 validation and 1,077 training digits; a 64-512-256-10 MLP (167k
parameters, 0.67 MB of float32 gradients). A *seed* sets the model's initial weights and every
node's batch order, not the split: the test set is one set for every run, and the validation
set that hyper-parameters are chosen on never overlaps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TEST, VAL = 360, 360
SPLIT_SEED = 0


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


def model(seed: int) -> Any:
    """The MLP, initialised from ``seed``."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def batch_generator(seed: int, node_index: int) -> Any:
    """Node ``node_index``'s batch order under ``seed`` (``nN`` is node N)."""
    import torch

    return torch.Generator().manual_seed(100_000 * seed + 1000 + node_index)
