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


def mtcnn_onet(weights: Path) -> Any:
    """MTCNN's output network (O-Net: face box, landmarks and face probability from a 48x48 RGB crop) in eval mode,
    with the pretrained weights in `weights` (a `torch.save` state_dict such as facenet-pytorch's `data/onet.pt`),
    loaded strictly: every parameter of the architecture below must be in the file, with its shape.

    forward(image FP32 [N, 3, 48, 48]) -> (box FP32 [N, 4], landmarks FP32 [N, 10], probs FP32 [N, 2]). The layers
    are MTCNN's (Zhang et al. 2016, "Joint Face Detection and Alignment using Multi-task Cascaded Convolutional
    Networks"), named as facenet-pytorch's state_dict names them.
    """
    import torch
    from torch import nn

    class ONet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.prelu1 = nn.Conv2d(3, 32, kernel_size=3), nn.PReLU(32)
            self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
            self.conv2, self.prelu2 = nn.Conv2d(32, 64, kernel_size=3), nn.PReLU(64)
            self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
            self.conv3, self.prelu3 = nn.Conv2d(64, 64, kernel_size=3), nn.PReLU(64)
            self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
            self.conv4, self.prelu4 = nn.Conv2d(64, 128, kernel_size=2), nn.PReLU(128)
            self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
            self.dense6_1 = nn.Linear(256, 2)
            self.softmax6_1 = nn.Softmax(dim=1)
            self.dense6_2 = nn.Linear(256, 4)
            self.dense6_3 = nn.Linear(256, 10)

        def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x = self.pool1(self.prelu1(self.conv1(image)))
            x = self.pool2(self.prelu2(self.conv2(x)))
            x = self.pool3(self.prelu3(self.conv3(x)))
            x = self.prelu4(self.conv4(x))
            # The weights were converted from Caffe, whose flattening order is (width, height, channels).
            x = self.prelu5(self.dense5(x.permute(0, 3, 2, 1).contiguous().view(x.shape[0], -1)))
            return self.dense6_2(x), self.dense6_3(x), self.softmax6_1(self.dense6_1(x))

    model = ONet()
    model.load_state_dict(torch.load(str(weights), map_location="cpu", weights_only=True), strict=True)
    return model.eval()


def mtcnn_onet_torchscript(weights: Path, path: Path) -> Path:
    """`mtcnn_onet` traced on a [2, 3, 48, 48] input and saved as TorchScript to `path`."""
    import torch

    torch.manual_seed(0)
    module = torch.jit.trace(mtcnn_onet(weights), (torch.rand(2, 3, 48, 48),))
    module.save(str(path))
    return path


def mtcnn_onet_exported(weights: Path, path: Path) -> Path:
    """`mtcnn_onet` exported with a dynamic batch axis and saved to `path` (`.pt2`)."""
    import torch

    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(
        mtcnn_onet(weights), (torch.rand(2, 3, 48, 48),), dynamic_shapes={"image": {0: batch}}
    )
    torch.export.save(program, str(path))
    return path
