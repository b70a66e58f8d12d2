"""What a user reviews after a build: the inspected signature as rows, the generated configuration against the
previous version's, and a check of new build options by the build's own rules before a rebuild.

Nothing here has rules of its own: options are checked by `builds.model_config.parse_build_options` and
`build_model_config` (the same calls the configure step makes), and the reason batching is on or off is the one
the build wrote in its log (`builds.verify_step.describe_batching_plan` in the configure step, and the verify step
when it proved batching unsafe).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from builds.choices import StepName
from builds.formats.triton_repository import (
    CONFIGURATION_OPTIONS,
    TritonRepositoryFormat,
    refuse_configuration_options,
)
from builds.inspection import ModelSignature, TensorSpec, short_dim_name
from builds.model_config import (
    GPU_PRODUCT_FIELD,
    GRAPH_INPUTS_FIELD,
    GRAPH_OUTPUTS_FIELD,
    INPUT_SPEC_FIELD,
    OUTPUT_DIMS_FIELD,
    OUTPUT_SPEC_FIELD,
    TENSORRT_VERSION_FIELD,
    TOLERANCE_FIELD,
    BuildOptions,
    adds_served_axis,
    build_model_config,
    parse_build_options,
)
from builds.models import BuildStep
from builds.services import state
from conch.errors import InvalidInput
from models_registry.choices import VersionStatus
from tritonserving.config import config_from_pbtxt, config_to_pbtxt

if TYPE_CHECKING:
    from models_registry.models import ModelVersion

__all__ = [
    "OPTION_NAMES",
    "ConfigDiff",
    "OptionsCheck",
    "SignatureRow",
    "batching_reason",
    "check_build_options",
    "config_diff",
    "diff_configs",
    "signature_rows",
]

#: The build options a user may change (the fields `parse_build_options` reads).
OPTION_NAMES = ("max_batch_size", "max_queue_delay_microseconds", "preferred_batch_size", "instance_count")
#: Form field that turns the dynamic batcher off: the same as asking for max_batch_size 0.
DYNAMIC_BATCHING_FIELD = "dynamic_batching"

# A log line is "HH:MM:SS message" (builds.services.pipeline.StepLog).
_STAMP = re.compile(r"^\d\d:\d\d:\d\d ")


@dataclass(frozen=True)
class OptionsCheck:
    """The result of checking build options: every field at fault, and the configuration they would give.

    `errors`: [{"field": option name, "detail": what is wrong and what to do}], at most one per field, in the
    order the build's rules found them. `options`: the options as parsed (None when any field is at fault).
    `config_pbtxt`: the configuration the configure step would write with these options ("" when the version
    has no signature yet or an option is at fault).
    """

    errors: list[dict[str, str]] = field(default_factory=list)
    options: BuildOptions | None = None
    config_pbtxt: str = ""

    @property
    def ok(self) -> bool:
        """True when no field is at fault."""
        return not self.errors


def option_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The option fields of a form or JSON body, with the dynamic batching switch turned into max_batch_size 0.

    `output_dims` (outputs' shapes in place of the declared ones), `tolerance` (a converted model's comparison
    tolerance), `graph_inputs` and `graph_outputs` (a frozen graph's nodes) are kept as given.
    `dynamic_batching` off ("off", "false", "0", False) means max_batch_size 0, as Triton has it (Triton "Model
    Configuration" -> "Maximum Batch Size": 0 turns batching, and so the dynamic batcher, off). Other keys are left
    out.
    """
    chosen = {name: fields.get(name) for name in OPTION_NAMES}
    chosen[OUTPUT_DIMS_FIELD] = fields.get(OUTPUT_DIMS_FIELD)
    chosen[TOLERANCE_FIELD] = fields.get(TOLERANCE_FIELD)
    chosen[GRAPH_INPUTS_FIELD] = fields.get(GRAPH_INPUTS_FIELD)
    chosen[GRAPH_OUTPUTS_FIELD] = fields.get(GRAPH_OUTPUTS_FIELD)
    for name in (INPUT_SPEC_FIELD, OUTPUT_SPEC_FIELD, GPU_PRODUCT_FIELD, TENSORRT_VERSION_FIELD):
        chosen[name] = fields.get(name)
    switch = fields.get(DYNAMIC_BATCHING_FIELD)
    if switch is not None and str(switch).strip().lower() in ("off", "false", "0", "no"):
        chosen["max_batch_size"] = 0
    return chosen


def check_build_options(*, version: ModelVersion, fields: Mapping[str, Any]) -> OptionsCheck:
    """Check build options for `version` with the build's own rules and say what each field at fault breaks.

    `fields`: form fields (strings) or JSON values for OPTION_NAMES (others ignored; see `option_fields` for the
    dynamic batching switch). The rules are `parse_build_options` (each option alone and against the others) and,
    when the version has been inspected, `build_model_config` with its signature (options the model cannot take,
    such as max_batch_size > 0 with a fixed axis 0). To report every field at fault rather than the first one, a
    field found at fault is set aside (as if left empty) and the rules run again.

    Returns an `OptionsCheck`; raises nothing for bad values.
    """
    remaining = option_fields(fields)
    signature = _signature(version)
    errors: list[dict[str, str]] = []
    build = state.current_build(version)
    if build is not None and build.source_format == TritonRepositoryFormat.key:
        # A Triton model repository's config.pbtxt configures the model: each option that would is at fault.
        for option in CONFIGURATION_OPTIONS:
            try:
                refuse_configuration_options({option: remaining.get(option)})
            except InvalidInput as exc:
                errors.append({"field": option, "detail": exc.detail})
                remaining[option] = None
    for _ in range(len(OPTION_NAMES) + 2):
        try:
            options = parse_build_options(remaining)
            config = (
                build_model_config(name=version.model.name, signature=signature, options=options)
                if signature is not None
                else None
            )
        except InvalidInput as exc:
            found = exc.refusals or (exc,)
            errors.extend({"field": one.field or "", "detail": one.detail} for one in found)
            set_aside = [
                one.field for one in found if one.field in remaining and remaining[one.field] not in (None, "")
            ]
            if not set_aside:
                break  # a rule of the model as a whole: nothing more to set aside
            for name in set_aside:
                remaining[name] = None
            continue
        if errors:
            return OptionsCheck(errors=errors)
        return OptionsCheck(options=options, config_pbtxt=config_to_pbtxt(config) if config is not None else "")
    return OptionsCheck(errors=errors)


def built_option_values(version: ModelVersion) -> dict[str, str]:
    """The values the version's built `config.pbtxt` has for the build options, as a form shows them (strings; an
    option the configuration leaves out, or a version not built, is absent).

    What a form shows beside an option left to the model's default: `max_batch_size`,
    `max_queue_delay_microseconds` and `preferred_batch_size` of the dynamic batcher, and `instance_count` (the
    instance groups' counts added up) — Triton "Model Configuration", "Maximum Batch Size", "Dynamic Batcher",
    "Instance Groups".
    """
    config_pbtxt = state.latest_config_pbtxt(version)
    if not config_pbtxt:
        return {}
    try:
        config = config_from_pbtxt(config_pbtxt)
    except InvalidInput:
        return {}
    values = {"max_batch_size": str(config.max_batch_size)}
    if config.HasField("dynamic_batching"):
        values["max_queue_delay_microseconds"] = str(config.dynamic_batching.max_queue_delay_microseconds)
        if config.dynamic_batching.preferred_batch_size:
            values["preferred_batch_size"] = ", ".join(str(n) for n in config.dynamic_batching.preferred_batch_size)
    if config.instance_group:
        values["instance_count"] = str(sum(group.count or 1 for group in config.instance_group))
    return values


def current_option_values(version: ModelVersion) -> dict[str, Any]:
    """The version's build options as a form shows them (None: the model's default), preferred sizes as "4, 8",
    output_dims as "387=-1,1,8210; other=1,4", tolerance as its number, graph_inputs/graph_outputs as "x, y" (for a
    frozen graph without them, the nodes its last build discovered)."""
    stored = state.current_options(version)
    values = {name: stored.get(name) for name in OPTION_NAMES}
    if values["preferred_batch_size"]:
        values["preferred_batch_size"] = ", ".join(str(size) for size in values["preferred_batch_size"])
    given = stored.get(OUTPUT_DIMS_FIELD) or {}
    values[OUTPUT_DIMS_FIELD] = (
        "; ".join(f"{name}={','.join(str(d) for d in dims)}" for name, dims in given.items()) if given else None
    )
    values[TOLERANCE_FIELD] = stored.get(TOLERANCE_FIELD)
    # A frozen graph's nodes: as given, else the guess the last build made (its signature's names), pre-filled
    build = state.current_build(version)
    signature = version.signature or {}
    for option, role in ((GRAPH_INPUTS_FIELD, "inputs"), (GRAPH_OUTPUTS_FIELD, "outputs")):
        given_nodes = stored.get(option)
        if not given_nodes and build is not None and build.source_format == "tf_graphdef":
            given_nodes = [tensor["name"] for tensor in signature.get(role) or ()]
        values[option] = ", ".join(given_nodes) if given_nodes else None
    # A TorchScript model's inputs: as given, else those its last build read (from the sample inputs), pre-filled;
    # a TensorRT plan's bindings and target as given
    for option, role in ((INPUT_SPEC_FIELD, "inputs"), (OUTPUT_SPEC_FIELD, "outputs")):
        spec = stored.get(option) or {}
        if not spec and option == INPUT_SPEC_FIELD and build is not None and build.source_format == "torchscript":
            spec = {t["name"]: {"datatype": t["datatype"], "dims": t["dims"]} for t in signature.get(role) or ()}
        values[option] = (
            "; ".join(
                f"{name}={item['datatype']}:{','.join(str(d) for d in item['dims'])}" for name, item in spec.items()
            )
            if spec
            else None
        )
    values[GPU_PRODUCT_FIELD] = stored.get(GPU_PRODUCT_FIELD)
    values[TENSORRT_VERSION_FIELD] = stored.get(TENSORRT_VERSION_FIELD)
    return values


@dataclass(frozen=True)
class SignatureRow:
    """One input or output of a built model, as the wizard's table shows it.

    `role` "input"/"output"; `datatype` the Triton datatype ("FP32"); `shape` the model's full shape as text with
    the batch axis marked ("[batch*, 3, 224, 224]" when Triton batches along axis 0; another dynamic axis shows
    the name the file gives it, else -1); `batch_axis` True when axis 0 is Triton's batch axis. `served_note`: ""
    or, for a tensor whose only axis is the batch axis, that clients send and receive it as [batch, 1] (Triton
    needs one dimension besides the batch axis: `dims: [1]` with an empty `reshape`, Triton "Reshape").
    """

    role: str
    name: str
    datatype: str
    dims: tuple[int, ...]
    dim_names: tuple[str | None, ...]
    shape: str
    batch_axis: bool
    served_note: str = ""

    @property
    def short_shape(self) -> str:
        """`shape` with every long axis name shortened (`short_dim_name`), as the console shows it; the page gives
        `shape` on hover when they differ."""
        return _shape_text(
            TensorSpec(name=self.name, datatype=self.datatype, dims=self.dims, dim_names=self.dim_names),
            self.batch_axis,
            shorten=True,
        )


_SERVED_WITH_ADDED_AXIS = (
    "served as [batch*, 1]: Triton needs one dimension besides the batch axis, so clients send and receive a last "
    "axis of 1"
)


def signature_rows(version: ModelVersion) -> list[SignatureRow]:
    """The inspected tensors of `version` (empty before inspection), inputs first, with the batch axis marked.

    Axis 0 is marked as the batch axis when the version's generated configuration batches (max_batch_size > 0:
    Triton then uses axis 0 of every tensor as the batch axis, Triton "Model Configuration" -> "Maximum Batch
    Size").
    """
    signature = _signature(version)
    if signature is None:
        return []
    config_pbtxt = state.latest_config_pbtxt(version)
    batching = bool(config_pbtxt) and config_from_pbtxt(config_pbtxt).max_batch_size > 0
    rows = []
    for role, specs in (("input", signature.inputs), ("output", signature.outputs)):
        for spec in specs:
            rows.append(
                SignatureRow(
                    role=role,
                    name=spec.name,
                    datatype=spec.datatype,
                    dims=spec.dims,
                    dim_names=spec.dim_names,
                    shape=_shape_text(spec, batching),
                    batch_axis=batching and bool(spec.dims),
                    served_note=(
                        _SERVED_WITH_ADDED_AXIS
                        if batching and adds_served_axis(len(spec.dims), batching=batching)
                        else ""
                    ),
                )
            )
    return rows


def batching_reason(version: ModelVersion) -> str:
    """Why the version's build batches or not, in the build's own words ("" before the configure step).

    The configure step logs its plan (`describe_batching_plan`: "batching: …" or "batching off: …") and the
    verify step logs its proof or the reason it turned batching off; the latest such line is the one in force.
    """
    configured = next((build for build in state.history(version) if build.config_pbtxt), None)
    if configured is None:
        return ""
    steps = BuildStep.objects.filter(build=configured, name__in=[StepName.CONFIGURE, StepName.VERIFY]).order_by(
        "position"
    )
    reason = ""
    for step in steps:
        for line in step.log or ():
            text = _STAMP.sub("", line)
            if text.startswith("batching"):
                reason = text
    return reason


@dataclass(frozen=True)
class ConfigDiff:
    """The version's config.pbtxt against the previous built version's of the same model.

    `previous_number`: that version's number (None when there is none: the diff is then empty). `diff`: a
    unified diff (difflib), "" when the two are the same or there is nothing to compare. `changed`: whether any
    line differs.
    """

    previous_number: int | None
    diff: str
    changed: bool


def config_diff(version: ModelVersion, versions: Any) -> ConfigDiff:
    """Diff `version`'s generated config.pbtxt against the previous built version's of its model.

    `versions`: a queryset of versions the caller may see (`models_registry.services.visible_versions`); the
    previous one is the highest-numbered built version of the same model below `version`'s number.
    """
    earlier = state.with_builds(
        versions.filter(model_id=version.model_id, number__lt=version.number, status=VersionStatus.BUILT).order_by(
            "-number"
        ),
        steps=False,
    )
    previous = next((row for row in earlier if state.latest_config_pbtxt(row)), None)
    config_pbtxt = state.latest_config_pbtxt(version)
    if previous is None or not config_pbtxt:
        return ConfigDiff(previous_number=previous.number if previous else None, diff="", changed=False)
    text = diff_configs(
        state.latest_config_pbtxt(previous),
        config_pbtxt,
        before_label=f"version {previous.number}/config.pbtxt",
        after_label=f"version {version.number}/config.pbtxt",
    )
    return ConfigDiff(previous_number=previous.number, diff=text, changed=bool(text))


def diff_configs(before: str, after: str, *, before_label: str, after_label: str) -> str:
    """A unified diff (difflib, 3 lines of context) of two config.pbtxt texts; "" when they are the same."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=before_label, tofile=after_label
    )
    return "".join(lines)


def _signature(version: ModelVersion) -> ModelSignature | None:
    return ModelSignature.from_dict(version.signature) if version.signature else None


def _shape_text(spec: TensorSpec, batching: bool, *, shorten: bool = False) -> str:
    parts = []
    for axis, (dim, name) in enumerate(zip(spec.dims, spec.dim_names, strict=True)):
        text = str(dim) if dim >= 0 else ((short_dim_name(name) if shorten else name) if name else "-1")
        if axis == 0 and batching:
            text = "batch*"
        parts.append(text)
    return "[" + ", ".join(parts) + "]"
