"""Pipelines as Triton ensembles: a pipeline's steps checked as a graph before anything deploys, and the ensemble's
model configuration generated from it.

An ensemble ("Ensemble Models" in Triton's user guide; `ensemble_scheduling` in model_config.proto) runs steps, each
a model, wired by named tensors: a step's `input_map` names, for each input of its model, the tensor that feeds it
(a pipeline input or another step's output); its `output_map` names the tensor each output of its model becomes.
Triton checks the wiring when the ensemble loads (core `src/model_config_utils.cc`, `ValidateEnsembleSchedulingConfig`;
`src/ensemble_scheduler/ensemble_utils.cc`, `ValidateEnsembleConfig`), one error at a time, naming models and
tensors. `check_pipeline` applies the same rules before any Triton sees the pipeline and reports every problem at
once, naming the step, the tensor and both sides:

- every step names a model the pipeline has, maps every input of it (no input twice) and only its own inputs and
  outputs;
- every tensor has one producer (a pipeline input or one step's output); every tensor a step takes has one;
- steps form no cycle (each step's inputs come from the pipeline's inputs or from steps before it);
- datatypes agree between a tensor's producer and each consumer; shapes agree where both are known (-1 matches any
  size), compared as configured or as full shapes with the batch axis, as Triton does, so a non-batching model's
  [-1, 3] meets a batching model's [3];
- every pipeline output is produced; every tensor is used (by a step or as a pipeline output), every pipeline input
  by a step;
- the pipeline's max_batch_size is at most that of every step whose model batches.

Pure: plain data and protobuf, no Django.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from conch.errors import ConchError, InvalidInput, refuse_each
from tritonserving.config import ModelConfig, datatype_name, datatype_value

__all__ = [
    "CheckedPipeline",
    "PipelineSpec",
    "StepSpec",
    "TensorType",
    "check_pipeline",
    "ensemble_config",
    "pipeline_from_config",
]

#: The field every pipeline problem is reported under.
FIELD = "steps"


@dataclass(frozen=True)
class TensorType:
    """A tensor's datatype and dims as a model configuration gives them.

    Attributes:
        datatype: Triton's datatype name ("FP32", "UINT8", "BYTES").
        dims: the dims, the batch axis left out when the model (or the pipeline) batches; -1 for any size.
        batching: whether the batch axis comes in front of `dims` (max_batch_size > 0).
    """

    datatype: str
    dims: tuple[int, ...]
    batching: bool = False

    @property
    def full_dims(self) -> tuple[int, ...]:
        """The shape a request carries: [-1, *dims] when batching, else dims."""
        return ((-1,) if self.batching else ()) + tuple(self.dims)

    def describe(self) -> str:
        """ "FP32 [-1, 3, 48, -1]": the datatype and the full shape."""
        return f"{self.datatype} [{', '.join(str(d) for d in self.full_dims)}]"


@dataclass(frozen=True)
class StepSpec:
    """One step of a pipeline.

    Attributes:
        name: the step's label in messages and on the pipeline page ("det"); the model's name when left empty.
        model: the Triton model the step runs.
        inputs: input of the model -> the tensor that feeds it (`input_map`).
        outputs: output of the model -> the tensor it becomes (`output_map`); outputs left out are dropped.
        version: the model version the step runs, -1 for the one the server serves.
    """

    model: str
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    name: str = ""
    version: int = -1

    @property
    def label(self) -> str:
        return self.name or self.model


@dataclass(frozen=True)
class PipelineSpec:
    """A pipeline: its inputs, its outputs and its steps.

    Attributes:
        name: the ensemble's model name.
        inputs: pipeline input -> its type (`TensorType.batching` is ignored: `max_batch_size` decides).
        outputs: the tensors the pipeline returns, by name.
        steps: the steps, in any order (`check_pipeline` orders them).
        max_batch_size: the largest batch the pipeline takes; 0 for none.
    """

    name: str
    inputs: Mapping[str, TensorType]
    outputs: Sequence[str]
    steps: Sequence[StepSpec]
    max_batch_size: int = 0


@dataclass(frozen=True)
class CheckedPipeline:
    """What `check_pipeline` found: the steps in an order that runs (each after the steps it takes tensors from),
    and each tensor's type and producer ("input" for a pipeline input, else the step's label)."""

    order: tuple[str, ...]
    tensors: Mapping[str, TensorType]
    producers: Mapping[str, str] = field(default_factory=dict)


def _model_tensors(config: ModelConfig) -> tuple[dict[str, TensorType], dict[str, TensorType]]:
    batching = config.max_batch_size > 0

    def of(entries: Sequence) -> dict[str, TensorType]:
        return {
            t.name: TensorType(datatype_name(t.data_type), tuple(int(d) for d in t.dims), batching) for t in entries
        }

    return of(config.input), of(config.output)


def _compatible(first: TensorType, second: TensorType) -> bool:
    def same(a: Sequence[int], b: Sequence[int]) -> bool:
        return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))

    return same(first.dims, second.dims) or same(first.full_dims, second.full_dims)


def _producer_text(producer: str) -> str:
    return "the pipeline input" if producer == "input" else f"step `{producer}` gives"


def check_pipeline(spec: PipelineSpec, models: Mapping[str, ModelConfig]) -> CheckedPipeline:
    """Check `spec`'s graph against the configurations of the models its steps run (model name -> configuration,
    as each is served); return the steps' order and every tensor's type.

    Raises InvalidInput (field "steps") for every problem the module docstring lists, all at once
    (`conch.errors.refuse_each`), each naming the step, the tensor and both sides, e.g. "step `rec` expects FP32
    [-1, 3, 48, -1] as its input 'x' (tensor 'crops'); step `crop` gives UINT8 [-1, 48, -1, 3]".
    """
    refusals: list[ConchError] = []

    def refuse(detail: str) -> None:
        refusals.append(InvalidInput(detail, field=FIELD))

    batching = spec.max_batch_size > 0
    if not spec.steps:
        refuse("The pipeline has no steps; give at least one (a model and its input and output mappings).")
    labels = [step.label for step in spec.steps]
    for label in sorted({label for label in labels if labels.count(label) > 1}):
        refuse(f"Two steps are called `{label}`; give each step a name of its own.")
    tensors: dict[str, TensorType] = {}
    producers: dict[str, str] = {}
    for name, tensor in spec.inputs.items():
        tensors[name] = TensorType(tensor.datatype, tuple(tensor.dims), batching)
        producers[name] = "input"
    consumers: dict[str, list[tuple[str, str, TensorType]]] = {}
    step_inputs: dict[str, set[str]] = {}
    for step in spec.steps:
        label = step.label
        config = models.get(step.model)
        if config is None:
            known = ", ".join(sorted(models)) or "none"
            refuse(f"Step `{label}` runs model {step.model!r}, which the pipeline has no model of (models: {known}).")
            continue
        model_inputs, model_outputs = _model_tensors(config)
        if config.max_batch_size > 0 and config.max_batch_size < spec.max_batch_size:
            refuse(
                f"The pipeline takes batches of up to {spec.max_batch_size}, but step `{label}`'s model "
                f"{step.model!r} batches at most {config.max_batch_size}; lower the pipeline's max_batch_size to "
                f"{config.max_batch_size} or rebuild the model with a larger one."
            )
        for model_input in step.inputs:
            if model_input not in model_inputs:
                refuse(
                    f"Step `{label}` maps {model_input!r}, which model {step.model!r} has no input of (its inputs: "
                    f"{', '.join(model_inputs)})."
                )
        fed = [tensor for tensor in step.inputs.values()]
        for name, tensor in model_inputs.items():
            optional = any(t.name == name and t.optional for t in config.input)
            if name not in step.inputs and not optional:
                refuse(
                    f"Step `{label}`: input {name!r} of model {step.model!r} ({tensor.describe()}) is fed by no "
                    "tensor; map it to a pipeline input or another step's output."
                )
        for model_input, tensor_name in step.inputs.items():
            if model_input in model_inputs:
                consumers.setdefault(tensor_name, []).append((label, model_input, model_inputs[model_input]))
        step_inputs[label] = set(fed)
        for model_output, tensor_name in step.outputs.items():
            if model_output not in model_outputs:
                refuse(
                    f"Step `{label}` maps {model_output!r}, which model {step.model!r} has no output of (its "
                    f"outputs: {', '.join(model_outputs)})."
                )
                continue
            if tensor_name in producers:
                first = producers[tensor_name]
                giver = "the pipeline input" if first == "input" else f"step `{first}`"
                refuse(
                    f"Tensor {tensor_name!r} is given by {giver} and by step `{label}`; each tensor has one producer: "
                    "rename one of them."
                )
                continue
            producers[tensor_name] = label
            tensors[tensor_name] = model_outputs[model_output]
    # every tensor a step takes has a producer, and its type agrees
    for tensor_name, users in consumers.items():
        if tensor_name not in producers:
            for label, model_input, _ in users:
                refuse(
                    f"Step `{label}` takes tensor {tensor_name!r} as its input {model_input!r}, but no step gives it "
                    "and it is not a pipeline input."
                )
            continue
        given = tensors[tensor_name]
        for label, model_input, wanted in users:
            if given.datatype != wanted.datatype or not _compatible(given, wanted):
                refuse(
                    f"Step `{label}` expects {wanted.describe()} as its input {model_input!r} (tensor "
                    f"{tensor_name!r}); {_producer_text(producers[tensor_name])} {given.describe()}."
                )
    # outputs produced; tensors used
    for output in spec.outputs:
        if output not in producers:
            refuse(f"Pipeline output {output!r} is given by no step; map a step's output to it.")
        elif producers[output] == "input":
            refuse(f"Pipeline output {output!r} is a pipeline input; return a step's output instead.")
    for tensor_name, producer in producers.items():
        if tensor_name in consumers or tensor_name in spec.outputs:
            continue
        if producer == "input":
            refuse(f"Pipeline input {tensor_name!r} is used by no step; map it to a step's input or remove it.")
        else:
            refuse(
                f"Tensor {tensor_name!r} of step `{producer}` is used by nothing; return it as a pipeline output, "
                "feed it to a step, or drop it from the step's output mappings."
            )
    order = _order(spec, producers, step_inputs, refuse)
    if refusals:
        raise refuse_each(refusals)
    return CheckedPipeline(order=tuple(order), tensors=tensors, producers=producers)


def _order(spec: PipelineSpec, producers: Mapping[str, str], step_inputs: Mapping[str, set[str]], refuse) -> list[str]:
    """The steps in a runnable order (Kahn's algorithm); refuses a cycle naming its steps."""
    labels = [step.label for step in spec.steps if step.label in step_inputs]
    needs = {
        label: {producers[t] for t in step_inputs[label] if t in producers and producers[t] not in ("input", label)}
        for label in labels
    }
    self_fed = [label for label in labels if any(producers.get(t) == label for t in step_inputs[label])]
    for label in self_fed:
        refuse(f"Step `{label}` takes a tensor it gives itself; a step's inputs come from before it.")
    order: list[str] = []
    done: set[str] = set()
    pending = list(labels)
    while pending:
        ready = [label for label in pending if needs[label] <= done]
        if not ready:
            cycle = _cycle(pending, needs)
            refuse(
                f"Steps {' → '.join(f'`{label}`' for label in cycle)} form a cycle: each step's inputs must come "
                "from the pipeline's inputs or from steps before it."
            )
            break
        for label in ready:
            order.append(label)
            done.add(label)
            pending.remove(label)
    return order


def _cycle(pending: Sequence[str], needs: Mapping[str, set[str]]) -> list[str]:
    """One cycle among `pending` steps, as a path that returns to its start."""
    start = pending[0]
    path = [start]
    seen = {start}
    current = start
    while True:
        following = sorted(needs[current] & set(pending))
        if not following:
            return path
        current = following[0]
        if current in seen:
            return path[path.index(current) :] + [current]
        path.append(current)
        seen.add(current)


def ensemble_config(spec: PipelineSpec, checked: CheckedPipeline) -> ModelConfig:
    """The ensemble's model configuration (`platform: "ensemble"`, Triton "Ensemble Models"): the pipeline's inputs
    as given, its outputs with the datatypes and dims their producing steps give, and one `ensemble_scheduling` step
    per pipeline step in `checked.order`."""
    config = ModelConfig()
    config.name = spec.name
    config.platform = "ensemble"
    config.max_batch_size = spec.max_batch_size
    for name, tensor in spec.inputs.items():
        entry = config.input.add()
        entry.name, entry.data_type = name, datatype_value(tensor.datatype)
        entry.dims.extend(tensor.dims)
    for name in spec.outputs:
        tensor = checked.tensors[name]
        entry = config.output.add()
        entry.name, entry.data_type = name, datatype_value(tensor.datatype)
        # An output a non-batching step gives, in a batching pipeline: its leading -1 is the batch axis.
        dims = tensor.full_dims[1:] if spec.max_batch_size > 0 and not tensor.batching else tensor.dims
        entry.dims.extend(dims)
    by_label = {step.label: step for step in spec.steps}
    for label in checked.order:
        step = by_label[label]
        entry = config.ensemble_scheduling.step.add()
        entry.model_name, entry.model_version = step.model, step.version
        for key, value in step.inputs.items():
            entry.input_map[key] = value
        for key, value in step.outputs.items():
            entry.output_map[key] = value
    return config


def pipeline_from_config(config: ModelConfig) -> PipelineSpec:
    """The pipeline an ensemble's configuration describes (an uploaded repository's ensemble), for `check_pipeline`.
    Steps are labelled by their model's name (with their position, "rec#2", when a model runs in several)."""
    batching = config.max_batch_size > 0
    models = [step.model_name for step in config.ensemble_scheduling.step]
    return PipelineSpec(
        name=config.name,
        inputs={
            t.name: TensorType(datatype_name(t.data_type), tuple(int(d) for d in t.dims), batching)
            for t in config.input
        },
        outputs=tuple(t.name for t in config.output),
        steps=tuple(
            StepSpec(
                model=step.model_name,
                name=step.model_name if models.count(step.model_name) == 1 else f"{step.model_name}#{position + 1}",
                version=int(step.model_version),
                inputs=dict(step.input_map),
                outputs=dict(step.output_map),
            )
            for position, step in enumerate(config.ensemble_scheduling.step)
        ),
        max_batch_size=int(config.max_batch_size),
    )
