"""Seed data for development tools and tests: a tiny ONNX model, and a version stored as built without a build.

Development tooling (no app imports it): bench/reconcile.py starts from a built version, and so do the deployment
tests (tests/deployments/conftest.py and tests/tiny_models.py re-export these two), without paying for the build
pipeline's verify Triton each time.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from django.utils import timezone
from onnx import TensorProto, helper

from builds.choices import BuildStatus
from builds.inspection import inspect_onnx
from builds.model_config import BuildOptions, build_model_config
from builds.models import Build
from models_registry.choices import VersionStatus
from models_registry.models import ModelVersion, RegisteredModel
from models_registry.services import repository_prefix, source_key
from models_registry.storage import get_object_store
from tenancy.models import Team
from tritonserving.config import config_to_pbtxt


def add_constant(path: Path, constant: float) -> Path:
    """Write y = x + `constant` to `path`: x FP32 [batch, 4] -> y FP32 [batch, 4]; returns `path`.

    Two of them with different constants are two versions of one model whose answers tell them apart.
    """
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "add_constant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor("c", TensorProto.FLOAT, [1], [constant])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_built_version(team: Team, name: str, model_file: Path, options: BuildOptions | None = None) -> ModelVersion:
    """Register `name` in `team`, store the ONNX file `model_file` and its Triton repository, and mark the version
    built; returns it.

    Uses the same pure functions and key layout as the build pipeline, without its verify step (covered in
    tests/builds), so a deployment test or a benchmark does not pay for a verify Triton. Raises what
    `inspect_onnx` raises for a file that is not a loadable ONNX model.
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
    version = ModelVersion.objects.create(
        model=model,
        number=number,
        status=VersionStatus.BUILT,
        source_key=source_key(model_id=model.pk, number=number),
        source_size_bytes=len(data),
        signature=signature.to_dict(),
    )
    now = timezone.now()
    Build.objects.create(
        version=version,
        attempt=1,
        status=BuildStatus.SUCCEEDED,
        options=(options or BuildOptions()).to_dict(),
        worker="devtools.seed",
        heartbeat_at=now,
        started_at=now,
        finished_at=now,
        config_pbtxt=config_to_pbtxt(config),
        repository_prefix=prefix,
    )
    return version
