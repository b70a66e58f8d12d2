"""Fixtures for deployment tests: a built classifier version, written the way a build writes it (`devtools.seed`)."""

from __future__ import annotations

import pytest

from builds.model_config import BuildOptions
from devtools.seed import add_constant, write_built_version
from models_registry.models import ModelVersion
from tests import real_models

# `write_built_version` (a version stored as built, no verify Triton) lives in the development tooling, which
# bench/reconcile.py uses too; the tests import it from here.


def write_adder_versions(team, folder) -> list[ModelVersion]:
    """Built versions 1 (y = x + 1) and 2 (y = x + 2) of model `adder` (x, y FP32 [batch, 4], batches up to 4),
    their ONNX files written under `folder`: two versions whose answers tell them apart."""
    return [
        write_built_version(
            team, "adder", add_constant(folder / f"v{n}.onnx", float(n)), BuildOptions(max_batch_size=4)
        )
        for n in (1, 2)
    ]


@pytest.fixture
def built_classifier(alice) -> ModelVersion:
    return write_built_version(alice.team, "classifier", real_models.classifier(), BuildOptions(max_batch_size=8))
