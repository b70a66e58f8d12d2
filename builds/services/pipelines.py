"""Pipelines a team composes from its built model versions: each version checked as a graph
(`builds.ensembles.check_pipeline`) against the configurations the steps' versions serve, and the ensemble's model
configuration generated, before anything deploys.

A step names a built model version (`model_version`: its id); the step runs that version of that model (Triton's
`ensemble_scheduling.step.model_name`/`model_version`), so every model name a pipeline uses must be the model's own
(a pipeline cannot run two versions of one model, as one Triton model repository holds one configuration per model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Max, QuerySet

from builds.ensembles import PipelineSpec, StepSpec, TensorType, check_pipeline, ensemble_config
from builds.models import Pipeline, PipelineVersion
from builds.services.state import served_config_pbtxt
from conch.errors import ConchError, Conflict, InvalidInput, NotFound, refuse_each
from models_registry import services as registry
from models_registry.choices import VersionStatus
from models_registry.naming import validate_model_name
from tenancy.audit import record_audit
from tenancy.choices import AuditAction, Role, Scope
from tenancy.services import TokenGrant, get_team_for_user, require_role, teams_for_user
from tritonserving.config import config_from_pbtxt, config_to_pbtxt

__all__ = ["create_pipeline", "create_pipeline_version", "get_pipeline", "list_pipelines"]

#: Triton's datatypes a pipeline input may have (model_config.proto's DataType, by name).
_DATATYPES: tuple[str, ...] = (
    *("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"),
    *("FP16", "FP32", "FP64", "BYTES", "BF16"),
)


def create_pipeline(*, user: User, team_slug: str, name: str, token: TokenGrant | None = None) -> Pipeline:
    """Register a pipeline name in a team (developer role; `models:write` with a token). The name is the ensemble's
    Triton model name: a DNS label (`validate_model_name`). Raises InvalidInput (field `name`), NotFound / Forbidden
    for the team, Conflict (field `name`) for a name the team has already."""
    validate_model_name(name)
    team = get_team_for_user(user=user, slug=team_slug, token=token)
    require_role(
        user=user, team=team, role=Role.DEVELOPER, action="Creating a pipeline", token=token, scope=Scope.MODELS_WRITE
    )
    try:
        with transaction.atomic():
            pipeline = Pipeline.objects.create(team=team, name=name, created_by=user)
            record_audit(action=AuditAction.PIPELINE_CREATED, team=team, target=pipeline)
            return pipeline
    except IntegrityError:
        raise Conflict(f"Team '{team.slug}' already has a pipeline named '{name}'.", field="name") from None


def list_pipelines(*, user: User, token: TokenGrant | None = None) -> QuerySet[Pipeline]:
    """The pipelines of the teams the caller sees."""
    return Pipeline.objects.filter(team__in=teams_for_user(user=user, token=token)).select_related("team")


def get_pipeline(*, user: User, pipeline_id: int, token: TokenGrant | None = None) -> Pipeline:
    """One pipeline the caller may see. Raises NotFound (also for another team's)."""
    pipeline = list_pipelines(user=user, token=token).filter(pk=pipeline_id).first()
    if pipeline is None:
        raise NotFound(f"Pipeline {pipeline_id} does not exist or is not in one of your teams.")
    return pipeline


def _tensor_type(where: str, raw: Any) -> TensorType:
    if not isinstance(raw, Mapping):
        raise InvalidInput(f'{where} must be an object {{"datatype": "FP32", "dims": [3, 224, 224]}}.', field="inputs")
    datatype = str(raw.get("datatype") or "").upper().removeprefix("TYPE_")
    if datatype not in _DATATYPES:
        raise InvalidInput(
            f"{where}: datatype {raw.get('datatype')!r} is not one of {', '.join(_DATATYPES)}.", field="inputs"
        )
    dims = raw.get("dims")
    if not isinstance(dims, list) or not all(isinstance(d, int) and (d == -1 or d > 0) for d in dims):
        raise InvalidInput(f"{where}: dims must be a list of sizes > 0 or -1, got {dims!r}.", field="inputs")
    return TensorType(datatype, tuple(dims))


def _names(where: str, raw: Any, field: str) -> dict[str, str]:
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise InvalidInput(f'{where} must be an object of tensor names, e.g. {{"x": "image"}}.', field=field)
    return dict(raw)


def create_pipeline_version(
    *, user: User, pipeline: Pipeline, spec: Mapping[str, Any], token: TokenGrant | None = None
) -> PipelineVersion:
    """Check `spec` (the `PipelineVersion.spec` form) against the configurations its steps' model versions serve and
    store it as the pipeline's next version with its graph and generated ensemble configuration.

    Raises InvalidInput naming the field (`inputs`, `outputs`, `steps`, `max_batch_size`) for a malformed spec,
    for a step's model version that is not the team's, not built, or a second version of a model another step runs,
    and every problem the graph check finds (field `steps`, all at once); Forbidden without the developer role.
    """
    require_role(
        user=user,
        team=pipeline.team,
        role=Role.DEVELOPER,
        action="Making a pipeline version",
        token=token,
        scope=Scope.MODELS_WRITE,
    )
    if not isinstance(spec, Mapping):
        raise InvalidInput("Send the pipeline version as a JSON object with inputs, outputs and steps.", field="steps")
    raw_inputs = spec.get("inputs")
    if not isinstance(raw_inputs, Mapping) or not raw_inputs:
        raise InvalidInput(
            'inputs must name the pipeline\'s inputs: {"image": {"datatype": "UINT8", "dims": [-1, -1, 3]}}.',
            field="inputs",
        )
    inputs = {str(name): _tensor_type(f"input {name!r}", raw) for name, raw in raw_inputs.items()}
    outputs = spec.get("outputs")
    if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str) for o in outputs):
        raise InvalidInput('outputs must list the tensors the pipeline returns: ["text"].', field="outputs")
    max_batch_size = spec.get("max_batch_size", 0)
    if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or not 0 <= max_batch_size <= 1024:
        raise InvalidInput(
            "max_batch_size must be a whole number from 0 (no batching) to 1024.", field="max_batch_size"
        )
    raw_steps = spec.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise InvalidInput(
            'steps must list the pipeline\'s steps: [{"name": "det", "model_version": 12, "inputs": {...}, '
            '"outputs": {...}}].',
            field="steps",
        )
    steps, models, refusals = [], {}, []
    versions_of_model: dict[str, int] = {}
    for position, raw in enumerate(raw_steps):
        where = f"steps[{position}]"
        if not isinstance(raw, Mapping):
            raise InvalidInput(f"{where} must be an object with model_version, inputs and outputs.", field="steps")
        version_id = raw.get("model_version")
        try:
            if not isinstance(version_id, int) or isinstance(version_id, bool):
                raise InvalidInput(f"{where}: model_version must be a model version's id.", field="steps")
            version = registry.get_version(user=user, version_id=version_id, token=token)
            if version.model.team_id != pipeline.team_id:
                raise NotFound(f"Model version {version_id} does not exist or is not in one of your teams.")
            pbtxt = served_config_pbtxt(version)
            if version.status != VersionStatus.BUILT or not pbtxt:
                raise InvalidInput(
                    f"{where}: model version {version_id} ({version.model.name}:{version.number}) is "
                    f"{version.status}, not built; a step runs a built version.",
                    field="steps",
                )
        except ConchError as error:
            refusals.append(error if isinstance(error, InvalidInput) else InvalidInput(error.detail, field="steps"))
            continue
        model_name = version.model.name
        if versions_of_model.setdefault(model_name, version.pk) != version.pk:
            refusals.append(
                InvalidInput(
                    f"{where}: model {model_name!r} runs in another step at another version; a pipeline runs one "
                    "version of each model.",
                    field="steps",
                )
            )
            continue
        models[model_name] = config_from_pbtxt(pbtxt)
        steps.append(
            StepSpec(
                model=model_name,
                name=str(raw.get("name") or model_name),
                version=version.number,
                inputs=_names(f"{where}.inputs", raw.get("inputs"), "steps"),
                outputs=_names(f"{where}.outputs", raw.get("outputs"), "steps"),
            )
        )
    if refusals:
        raise refuse_each(refusals)
    pipeline_spec = PipelineSpec(
        name=pipeline.name, inputs=inputs, outputs=tuple(outputs), steps=tuple(steps), max_batch_size=max_batch_size
    )
    checked = check_pipeline(pipeline_spec, models)
    config = ensemble_config(pipeline_spec, checked)
    graph = {
        "order": list(checked.order),
        "tensors": {
            name: {
                "datatype": tensor.datatype,
                "dims": list(tensor.full_dims),
                "producer": checked.producers.get(name, ""),
            }
            for name, tensor in checked.tensors.items()
        },
    }
    stored = {
        "inputs": {name: {"datatype": t.datatype, "dims": list(t.dims)} for name, t in inputs.items()},
        "outputs": list(outputs),
        "max_batch_size": max_batch_size,
        "steps": [
            {
                "name": step.label,
                "model_version": versions_of_model[step.model],
                "model": step.model,
                "version": step.version,
                "inputs": dict(step.inputs),
                "outputs": dict(step.outputs),
            }
            for step in steps
        ],
    }
    with transaction.atomic():
        locked = Pipeline.objects.select_for_update().get(pk=pipeline.pk)
        number = (locked.versions.aggregate(top=Max("number"))["top"] or 0) + 1
        made = PipelineVersion.objects.create(
            pipeline=locked,
            number=number,
            spec=stored,
            graph=graph,
            config_pbtxt=config_to_pbtxt(config),
            created_by=user,
        )
        record_audit(
            action=AuditAction.PIPELINE_VERSION_CREATED,
            team=pipeline.team,
            target=locked,
            after={"number": number, "steps": [step.label for step in steps]},
        )
        return made
