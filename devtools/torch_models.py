"""Tiny PyTorch models for tests and benchmarks (development tooling), built with fixed seeds and saved the ways
Conch takes PyTorch models: an exported program (`torch.export.save`, `.pt2`), TorchScript (`torch.jit.save` of a
scripted or traced module), and, for the refusals, a `torch.save` checkpoint and a module whose `forward` takes an
`int`.

The classifier maps FEATURES FP32 columns to CLASSES softmax probabilities and their logits (two Linear layers),
so the outputs are real numbers to compare. Each function returns the path it wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FEATURES = 5
CLASSES = 3


def classifier(seed: int = 0) -> Any:
    """A `torch.nn.Module` in eval mode: forward(features FP32 [N, 5]) -> (probs FP32 [N, 3], logits FP32 [N, 3])."""
    import torch

    torch.manual_seed(seed)

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = torch.nn.Linear(FEATURES, 8)
            self.head = torch.nn.Linear(8, CLASSES)

        def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits = self.head(torch.relu(self.hidden(features)))
            return torch.softmax(logits, dim=-1), logits

    return Classifier().eval()


def exported_program(path: Path, seed: int = 0) -> Path:
    """`classifier` exported with a dynamic batch axis (`torch.export.Dim`) and saved to `path` (`.pt2`)."""
    import torch

    model = classifier(seed)
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(model, (torch.randn(2, FEATURES),), dynamic_shapes={"features": {0: batch}})
    torch.export.save(program, str(path))
    return path


def torchscript(path: Path, seed: int = 0, *, traced: bool = False) -> Path:
    """`classifier` as TorchScript (`torch.jit.script`, or `torch.jit.trace` on a [2, 5] input) saved to `path`."""
    import torch

    model = classifier(seed)
    module = torch.jit.trace(model, (torch.randn(2, FEATURES),)) if traced else torch.jit.script(model)
    module.save(str(path))
    return path


def checkpoint(path: Path, seed: int = 0) -> Path:
    """`classifier`'s state_dict saved with `torch.save` (weights only, no graph) to `path`."""
    import torch

    torch.save(classifier(seed).state_dict(), str(path))
    return path


def with_int_argument(path: Path) -> Path:
    """A scripted module whose forward takes `x` FP32 and an `int` `steps`, saved to `path` (TorchScript)."""
    import torch

    class Repeat(torch.nn.Module):
        def forward(self, x: torch.Tensor, steps: int) -> torch.Tensor:
            return x * steps

    torch.jit.script(Repeat()).save(str(path))
    return path
