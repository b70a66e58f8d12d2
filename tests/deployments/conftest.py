"""Fixtures for deployment tests: a built classifier version, written the way a build writes it."""

from __future__ import annotations

import pytest

from builds.inspection import inspect_onnx
from builds.model_config import BuildOptions, build_model_config
from models_registry.choices import VersionStatus
from models_registry.models import ModelVersion, RegisteredModel
from models_registry.services import repository_prefix, source_key
from models_registry.storage import get_object_store
from tests import real_models
from tests.tiny_models import add_constant
from tritonserving.config import config_to_pbtxt


def write_built_version(team, name: str, model_file, options: BuildOptions | None = None) -> ModelVersion:
    """Register `name`, store `model_file` and its Triton repository, and mark the version built.

    Uses the same pure functions and key layout as the build pipeline, without its verify step
    (that is covered in tests/builds), so deployment tests don't pay for a verify Triton each.
    """
    model, _ = RegisteredModel.objects.get_or_create(team=team, name=name)
    number = model.versions.count() + 1
    store = get_object_store()
    data = model_file.read_bytes()
    store.put_bytes(source_key(model_id=model.pk, number=number), data)
    signature = inspect_onnx(model_file)
    config = build_model_config(name=name, signature=signature, options=options or BuildOptions())
    prefix = repository_prefix(model_id=model.pk, number=number)
    store.put_bytes(f"{prefix}/{name}/{number}/model.onnx", data)
    store.put_bytes(f"{prefix}/{name}/config.pbtxt", config_to_pbtxt(config).encode())
    return ModelVersion.objects.create(
        model=model,
        number=number,
        status=VersionStatus.BUILT,
        source_key=source_key(model_id=model.pk, number=number),
        source_size_bytes=len(data),
        signature=signature.to_dict(),
        config_pbtxt=config_to_pbtxt(config),
        repository_prefix=prefix,
    )


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
