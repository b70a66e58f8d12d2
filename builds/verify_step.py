"""The build's verify step: sample inferences on a scratch Triton, and the proof that batching is safe.

Batching is decided from the model, never guessed. The configure step takes axis 0 for the batch axis only when
the shapes and axis names say so (`builds.model_config.read_batch_axis`, logged by `describe_batching_plan`);
`verify_build` then proves it by running two different samples alone and joined on axis 0, as Triton's dynamic
batcher joins requests (Triton "Dynamic Batcher"), and builds the version without batching when the joined run
differs. Samples come from the user (`UserSamples`, stored beside the source) or are generated.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from django.conf import settings

from builds.comparison import compare_outputs
from builds.inspection import ModelSignature, short_dim_name
from builds.model_config import (
    MODEL_FILENAME,
    OUTPUT_DIMS_FIELD,
    BuildOptions,
    read_batch_axis,
    with_output_shapes,
    without_batching,
)
from builds.packaging import describe_packaging, outputs_to_redeclare, package_model_file
from builds.verification import (
    PROBE_DYNAMIC_SIZE,
    SAMPLE_INPUTS_FIELD,
    SAMPLE_VALUES_FIELD,
    ObservedShapes,
    SampleLimits,
    UserSamples,
    VerificationError,
    check_output_shapes,
    compare_joined_outputs,
    describe_sample_inputs,
    join_samples,
    make_sample_inputs,
    merge_observed_shapes,
    output_shape_mismatches,
    read_sample_arrays,
)
from conch.errors import InvalidInput
from models_registry.storage import ObjectStore
from tritonserving.client import TritonRequestError
from tritonserving.config import ModelConfig, config_to_pbtxt, datatype_name
from tritonserving.smoke import ScratchServer, VerifyServer, run_smoke_inference

if TYPE_CHECKING:
    from builds.models import Build

__all__ = [
    "SourceReference",
    "axis_names_text",
    "compare_with_source",
    "describe_batching_plan",
    "load_samples",
    "sample_limits",
    "verify_build",
]

_Say = Callable[[str], None]
_SmokeRun = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
#: Requests the comparison with the source framework sends when the model batches, each a full batch
#: (max_batch_size samples) of its own generated values; a model without batching gets one request.
COMPARISON_REQUESTS = 4


@dataclass(frozen=True)
class SourceReference:
    """The source framework of a converted model, as verify uses it.

    `title`: the source format's name ("LightGBM model (text)"); `run(inputs)`: the source framework's outputs for
    `inputs` (input name -> full array), keyed by the converted model's output names (`run_source_in_sandbox`);
    `record(comparisons, seconds)`: stores the comparison (`OutputComparison.to_dict()` per output) and the seconds
    the source framework's run took on the build.
    """

    title: str
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    record: Callable[[list[dict[str, Any]], float], None]
    #: False for a model served as uploaded (TorchScript), which verify compares with its own framework's run.
    converted: bool = True


def sample_limits() -> SampleLimits:
    """The limits of an unpacked `.npz` of sample inputs, from settings CONCH_MAX_SAMPLE_UNPACKED_BYTES and
    CONCH_MAX_SAMPLE_ARRAYS (read when called)."""
    return SampleLimits(
        max_unpacked_bytes=settings.CONCH_MAX_SAMPLE_UNPACKED_BYTES, max_arrays=settings.CONCH_MAX_SAMPLE_ARRAYS
    )


def load_samples(store: ObjectStore, build_options: Mapping[str, Any]) -> UserSamples:
    """The user's sample inputs of a version, read back from the object store (empty when it has none).

    The `.npz` is checked against `sample_limits()` again here, whatever put it in the store, before any array is
    unpacked: PayloadTooLarge (field sample_inputs, naming the limit) past them, InvalidInput for a bad file.
    """
    described = build_options.get("samples") or {}
    key = described.get("key")
    arrays = read_sample_arrays(store.read_bytes(key), limits=sample_limits()) if key else {}
    return UserSamples(arrays=arrays, values=dict(described.get("values") or {}))


def axis_names_text(names: tuple[str | None, ...]) -> str:
    """Log text such as ' axes [seq, batch, -]' for a tensor with symbolic axis names ('-' = unnamed), else ''.
    A long name is shortened (`short_dim_name`); the model page's signature shows it whole on hover."""
    shown = [short_dim_name(name) if name else "-" for name in names]
    return f" axes [{', '.join(shown)}]" if any(names) else ""


def describe_batching_plan(signature: ModelSignature, options: BuildOptions, config: ModelConfig) -> list[str]:
    """Lines for the configure step's log: whether the model will batch, and why (naming tensors and axis names)."""
    reading = read_batch_axis(signature)
    batcher = "on" if config.HasField("dynamic_batching") else "off"
    lines = [f"max_batch_size={config.max_batch_size} dynamic_batching={batcher}"]
    if config.max_batch_size > 0 and reading.batchable:
        lines.append("batching: axis 0 is the same dynamic axis on every input and output; verify will prove it safe")
    elif config.max_batch_size > 0:
        lines.append(
            f"batching: max_batch_size {options.max_batch_size} was asked for although {reading.explain()} "
            "Verify will prove that batching is safe, or the build fails."
        )
    elif options.max_batch_size == 0:
        lines.append("batching off: max_batch_size 0 was asked for")
    else:
        lines.append(
            f"batching off: {reading.explain()} The model is served one request per run (max_batch_size 0, full "
            "dims, no dynamic batcher). To batch it anyway, upload it with max_batch_size set: the verify step "
            "then proves batching is safe."
        )
    return lines


def verify_build(
    *,
    build: Build,
    record_config: Callable[[str], None],
    store: ObjectStore,
    prefix: str,
    config: ModelConfig,
    signature: ModelSignature,
    options: BuildOptions,
    say: _Say,
    scratch: Callable[[], ScratchServer | VerifyServer],
    source_file: Path,
    source_key: str | None = None,
    reference: SourceReference | None = None,
) -> ModelConfig:
    """Run the verify step of `build` on the repository it wrote under `prefix`; return the configuration it keeps.

    `source_file` is the local ONNX model the repository's model file was packaged from, `source_key` the stored
    upload it is a copy of (None for a converted model, uploaded from `source_file`). For a converted model,
    `reference` runs the source framework: once the configuration is settled, the same inputs go through the
    served model and the source framework and every output is compared (`compare_with_source`).

    `record_config` is called with the configuration text each time verify rewrites config.pbtxt (the pipeline
    records it on the build).

    Batching configurations are proven first (Triton "Dynamic Batcher" joins requests along axis 0): two
    different samples run alone and joined on axis 0, on one scratch server, and the joined run must give each
    sample its own outputs (`compare_joined_outputs`). When it does not, or the joined run fails, the repository's
    config.pbtxt is rewritten without batching (`without_batching`) and verified again, and the log says which
    output differed; if the user asked for max_batch_size > 0 the build fails instead (field max_batch_size).

    Output shapes: an output that comes back in a shape other than the one the model file declares (a model file
    can declare a wrong shape) is observed once more with a probe sample whose dynamic axes have other sizes
    (PROBE_DYNAMIC_SIZE); when every run gave it the same rank, config.pbtxt is rewritten with the observed shape
    (-1 where the runs differed) and the log says so (`_settle_output_shapes`). Different ranks, or a shape the
    user gave in `output_dims` that the model does not return, fail the build (field output_dims) saying how to
    give the shape. Whenever config.pbtxt is rewritten, the repository's model file is packaged again from
    `source_file` (a local copy of the upload) so that it declares the configured output shapes
    (`builds.packaging.package_model_file`: Triton's C++ onnxruntime backend refuses a configuration whose outputs
    disagree with the file), and the log says which outputs the copy redeclares.

    Raises InvalidInput / VerificationError for a model that fails verification (naming the tensor, what was sent
    and, when inputs were generated, how to supply samples), Unavailable when no scratch server starts.
    """
    samples = load_samples(store, build.options or {})
    run = _smoke_runner(store, prefix, config.name, say, scratch, label=f"v{build.version.pk}-a{build.attempt}")
    kept = _verify_configuration(
        build=build,
        record_config=record_config,
        store=store,
        prefix=prefix,
        config=config,
        signature=signature,
        options=options,
        say=say,
        run=run,
        samples=samples,
        source_file=source_file,
        source_key=source_key,
    )
    if reference is not None:
        compare_with_source(
            run=run, reference=reference, config=kept, signature=signature, samples=samples, options=options, say=say
        )
    return kept


def _verify_configuration(
    *,
    build: Build,
    record_config: Callable[[str], None],
    store: ObjectStore,
    prefix: str,
    config: ModelConfig,
    signature: ModelSignature,
    options: BuildOptions,
    say: _Say,
    run: _SmokeRun,
    samples: UserSamples,
    source_file: Path,
    source_key: str | None,
) -> ModelConfig:
    """`verify_build` up to the configuration it keeps: batching proven or turned off, output shapes settled."""

    version = build.version

    model_key = f"{prefix}/{config.name}/{version.number}/{config.default_model_filename or MODEL_FILENAME}"
    # The outputs the repository's model file redeclares now (the write step packaged it for `config`).
    packaged_for = {"outputs": outputs_to_redeclare(config, signature)}

    def rewrite(new_config: ModelConfig) -> None:
        wanted = outputs_to_redeclare(new_config, signature)
        if wanted != packaged_for["outputs"]:
            packaged = package_model_file(
                store=store,
                source_key=source_key,
                source_file=source_file,
                model_key=model_key,
                config=new_config,
                signature=signature,
            )
            packaged_for["outputs"] = wanted
            again = f"{model_key}: the uploaded file as it is, its outputs agree with config.pbtxt again"
            for line in describe_packaging(packaged, model_key) or [again]:
                say(line)
        pbtxt = config_to_pbtxt(new_config)
        store.put_bytes(f"{prefix}/{new_config.name}/config.pbtxt", pbtxt.encode())
        record_config(pbtxt)

    settle = functools.partial(
        _settle_output_shapes,
        run=run,
        say=say,
        signature=signature,
        samples=samples,
        options=options,
        rewrite=rewrite,
        version_id=version.pk,
    )
    if config.max_batch_size > 0:
        first = make_sample_inputs(config, signature=signature, samples=samples, item=0)
        second = make_sample_inputs(config, signature=signature, samples=samples, item=1)
        for index, inputs in enumerate((first, second), start=1):
            for line in describe_sample_inputs(inputs, samples):
                say(f"sample {index} input {line}")
        try:
            outputs_first, outputs_second, outputs_joined = run([first, second, join_samples(first, second)])
        except InvalidInput as exc:
            problem = f"the model failed on the two samples, run alone and joined on axis 0 ({exc.detail})"
        else:
            _say_outputs(say, outputs_first)
            try:
                config = settle(config=config, observed=[_shapes(outputs_first), _shapes(outputs_second)])
            except VerificationError as exc:
                if exc.field == OUTPUT_DIMS_FIELD and exc.detail.startswith(_OVERRIDE_REFUSED):
                    raise
                problem = f"the outputs of the samples alone do not have one shape with a batch axis ({exc.detail})"
            else:
                check = compare_joined_outputs(config, [outputs_first, outputs_second], outputs_joined)
                problem = check.problem
                if not problem:
                    say(
                        "batching proven: two different samples joined on axis 0 gave each sample its own outputs "
                        f"(largest difference {check.max_difference:.3g})"
                    )
                    return config
        say(f"batching off: {problem}")
        config = without_batching(config)
        rewrite(config)
        say("rewrote config.pbtxt with max_batch_size 0, full dims and no dynamic batcher; verifying again")
        if options.max_batch_size:
            refusal = InvalidInput(
                f"max_batch_size {options.max_batch_size} was asked for, but batching is not safe for this model: "
                f"{problem}. Joining requests would change their results. Upload the model again with "
                "max_batch_size empty or 0 (in config.pbtxt, for a Triton model repository or a Python model's "
                "archive) to serve it one request per run.",
                field="max_batch_size",
            )
            try:
                _run_alone(run, say, config, signature, samples, version.pk, settle)
            except InvalidInput as alone:
                # The batching asked for is what fails first; that it fails unbatched too is said after it.
                raise InvalidInput(
                    f"{refusal.detail} Without batching it fails too: {alone.detail}", field="max_batch_size"
                ) from alone
            raise refusal
    return _run_alone(run, say, config, signature, samples, version.pk, settle)


def compare_with_source(
    *,
    run: _SmokeRun,
    reference: SourceReference,
    config: ModelConfig,
    signature: ModelSignature,
    samples: UserSamples,
    options: BuildOptions,
    say: _Say,
) -> None:
    """Prove a converted model computes what its source computes: the same inputs through the served model (`run`,
    on the scratch Triton) and through the source framework (`reference.run`), every output compared
    (`builds.comparison.compare_outputs`, tolerances by datatype or the user's `options.tolerance`).

    Inputs: the user's samples, else generated ones that respect the signature; a batching model gets
    COMPARISON_REQUESTS requests of max_batch_size samples each (a generated request's values seeded by its index).
    Logs one line per output, over all the requests, and records the figures
    (`reference.record`). Raises VerificationError (field "tolerance") naming each output that differs, with the
    figures and how to accept a looser tolerance.
    """
    if config.max_batch_size > 0:
        requests = [
            make_sample_inputs(config, signature=signature, samples=samples, rows=config.max_batch_size, seed=seed)
            for seed in range(COMPARISON_REQUESTS)
        ]
        if samples.arrays or samples.values:  # the user's samples are the same in every request: send them once
            requests = requests[:1]
    else:
        requests = [make_sample_inputs(config, signature=signature, samples=samples)]
    for line in describe_sample_inputs(requests[0], samples):
        say(f"comparison input {line}" + (f" (and {len(requests) - 1} more like it)" if len(requests) > 1 else ""))
    served_runs = run(requests)
    # All the requests as one: their samples joined on axis 0 (each request's arrays are full tensors).
    inputs = _joined(requests)
    served = _joined(served_runs)
    started = time.monotonic()
    source = reference.run(inputs)
    source_seconds = time.monotonic() - started
    datatypes = {tensor.name: datatype_name(tensor.data_type) for tensor in config.output}
    comparisons = compare_outputs(source, served, datatypes, accepted=options.tolerance)
    origin = "it was converted from" if reference.converted else "run by its own framework"
    say(f"comparing the served model with the {reference.title} {origin}, on the same inputs")
    for comparison in comparisons:
        say(comparison.describe())
    reference.record([comparison.to_dict() for comparison in comparisons], source_seconds)
    failed = [comparison for comparison in comparisons if comparison.problem]
    if failed:
        details = "; ".join(f"output {c.name}: {c.problem} (tolerance {c.tolerance.describe()})" for c in failed)
        raise VerificationError(
            f"The converted model does not compute what the {reference.title} computes: {details}. If the "
            "conversion lost precision you can accept, rebuild with a looser tolerance for floating outputs "
            "(POST /api/v1/versions/{id}/rebuild with tolerance=0.001, used as both atol and rtol); otherwise "
            "convert the model to ONNX yourself and upload the .onnx file.",
            field="tolerance",
        )


def _joined(arrays: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per name, the arrays of several requests or responses concatenated on axis 0 (one alone as it is)."""
    if len(arrays) == 1:
        return {name: np.asarray(array) for name, array in arrays[0].items()}
    return {name: np.concatenate([np.asarray(each[name]) for each in arrays], axis=0) for name in arrays[0]}


def _run_alone(
    run: _SmokeRun,
    say: _Say,
    config: ModelConfig,
    signature: ModelSignature,
    samples: UserSamples,
    version_id: int,
    settle: Callable[..., ModelConfig],
) -> ModelConfig:
    """Verify a configuration without batching: one sample request, its output shapes settled; returns the
    configuration kept (rewritten when an output's declared shape was wrong)."""
    inputs = make_sample_inputs(config, signature=signature, samples=samples)
    described = describe_sample_inputs(inputs, samples)
    for line in described:
        say(f"sample input {line}")
    try:
        [outputs] = run([inputs])
    except InvalidInput as exc:
        generated = [line for name, line in zip(inputs, described, strict=True) if samples.origin(name) == "generated"]
        if not isinstance(exc.__cause__, TritonRequestError) or not generated:
            raise
        raise InvalidInput(
            f"{exc.detail}. Conch generated these inputs because none were supplied: {'; '.join(generated)}. If "
            "the model needs particular inputs, supply samples: upload the model again with "
            f"-F {SAMPLE_INPUTS_FIELD}=@samples.npz (numpy.savez('samples.npz', input_name=array, ...), arrays in "
            f"the shapes the model takes) and/or -F {SAMPLE_VALUES_FIELD}='name=value' (e.g. sr=16000), or add them "
            f"to this version with POST /api/v1/versions/{version_id}/rebuild and the same fields.",
            field=SAMPLE_INPUTS_FIELD,
        ) from exc
    _say_outputs(say, outputs)
    return settle(config=config, observed=[_shapes(outputs)])


#: How the refusal of a user's own output_dims begins (it is not turned into "batching off").
_OVERRIDE_REFUSED = "output_dims gives output"


def _settle_output_shapes(
    *,
    config: ModelConfig,
    observed: list[dict[str, tuple[int, ...]]],
    run: _SmokeRun,
    say: _Say,
    signature: ModelSignature,
    samples: UserSamples,
    options: BuildOptions,
    rewrite: Callable[[ModelConfig], None],
    version_id: int,
) -> ModelConfig:
    """Return `config` when every observed output shape fits it; else the configuration with observed shapes.

    `observed`: the output shapes (name -> full shape) of sample runs of `config`, each a batch of one when it
    batches. An output whose shape the configuration does not allow is one whose declared shape is wrong (the
    model file's, or the user's `output_dims`). A user's shape is not overruled: VerificationError (field
    output_dims). Otherwise config.pbtxt is rewritten with the observed rank and every axis -1, a probe sample with
    other dynamic sizes (PROBE_DYNAMIC_SIZE, the second sample's values) runs on it, and the output gets the merged
    shape of all runs (`merge_observed_shapes`: -1 where they differed; axis 0 -1 when batching): rewritten again,
    and said in the log. Runs that gave the output different ranks fail the build (field output_dims) with how to
    give the shape. Outputs that did not come back raise as in `check_output_shapes`.
    """
    batching = config.max_batch_size > 0
    batch_size = 1 if batching else 0
    mismatched: list[str] = []
    for shapes in observed:
        mismatched += [
            name for name in output_shape_mismatches(config, shapes, batch_size=batch_size) if name not in mismatched
        ]
    if not mismatched:
        return config
    declared = {tensor.name: _declared_shape(tensor, batching) for tensor in config.output}
    given = options.output_dims or {}
    for name in mismatched:
        if name in given:
            seen = ", ".join(_text(shapes[name]) for shapes in observed if name in shapes)
            raise VerificationError(
                f"{_OVERRIDE_REFUSED} {name!r} the shape {_text(given[name])}, but the model returned {seen} for "
                "the verify step's samples. Rebuild with output_dims giving the shape the model returns (-1 for an "
                "axis of any size), or without it: Conch then takes the shape the model returns.",
                field=OUTPUT_DIMS_FIELD,
            )
    merged = merge_observed_shapes(observed, mismatched, batch_axis=batching)
    _refuse_varying_ranks(merged, declared, version_id)
    if batching and (scalar := next((name for name in mismatched if not merged.shapes[name]), None)):
        raise VerificationError(f"output {scalar!r} came back as a scalar, which has no batch axis 0")
    provisional = with_output_shapes(config, {name: (-1,) * len(merged.shapes[name]) for name in mismatched})
    rewrite(provisional)
    for name in mismatched:
        say(
            f"output {name}: came back as {_text(observed[0].get(name, ()))} but the model file declares "
            f"{_text(declared[name])}; running a probe sample with other sizes to see which axes vary"
        )
    probe = make_sample_inputs(
        provisional, signature=signature, samples=samples, item=1, dynamic_size=PROBE_DYNAMIC_SIZE
    )
    for line in describe_sample_inputs(probe, samples):
        say(f"probe input {line}")
    [probe_outputs] = run([probe])
    _say_outputs(say, probe_outputs, label="probe output")
    observed = [*observed, _shapes(probe_outputs)]
    merged = merge_observed_shapes(observed, mismatched, batch_axis=batching)
    _refuse_varying_ranks(merged, declared, version_id)
    settled = with_output_shapes(config, merged.shapes)
    for shapes in observed:
        check_output_shapes(settled, shapes, batch_size=batch_size)
    rewrite(settled)
    for name in mismatched:
        seen = ", ".join(_text(shapes[name]) for shapes in observed if name in shapes)
        say(
            f"output {name}: the model file declares {_text(declared[name])}, but the model returned {seen}; "
            f"config.pbtxt gives it the observed shape {_text(merged.shapes[name])} (-1 where the runs differed). "
            f"To give another shape, rebuild with {OUTPUT_DIMS_FIELD} (e.g. {name}=-1,...)"
        )
    return settled


def _refuse_varying_ranks(merged: ObservedShapes, declared: Mapping[str, tuple[int, ...]], version_id: int) -> None:
    if not merged.problems:
        return
    name, seen = next(iter(merged.problems.items()))
    raise VerificationError(
        f"Output {name!r} came back with shapes of different ranks for the verify step's samples ({seen}), and "
        f"the model file declares {_text(declared[name])}, so Conch cannot tell which shape to give it in "
        "config.pbtxt (Triton needs one rank per output). If the model returns one rank for the requests it will "
        f"serve, give that shape yourself with the build option {OUTPUT_DIMS_FIELD}, the output's full shape with "
        f"-1 for an axis of any size: POST /api/v1/versions/{version_id}/rebuild with "
        f'{{"{OUTPUT_DIMS_FIELD}": {{"{name}": [-1, -1]}}}} (or -F {OUTPUT_DIMS_FIELD}=\'{name}=-1,-1\' with an '
        f"upload), and send {SAMPLE_INPUTS_FIELD} like those requests.",
        field=OUTPUT_DIMS_FIELD,
    )


def _declared_shape(tensor: Any, batching: bool) -> tuple[int, ...]:
    """The full model shape a config output declares (axis 0 as -1 when batching)."""
    body = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
    return tuple([-1, *body] if batching else body)


def _shapes(outputs: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(int(d) for d in array.shape) for name, array in outputs.items()}


def _say_outputs(say: _Say, outputs: Mapping[str, Any], *, label: str = "output") -> None:
    for name, shape in _shapes(outputs).items():
        say(f"{label} {name}: {list(shape)}")


def _text(shape: Any) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _smoke_runner(
    store: ObjectStore,
    prefix: str,
    model_name: str,
    say: _Say,
    scratch: Callable[[], ScratchServer | VerifyServer],
    *,
    label: str,
) -> _SmokeRun:
    """A function that loads the repository under `prefix` in a scratch Triton and runs the given input sets.

    A warm verify server gets the model directory copied from the store for each run (`_model_directory_stager`),
    so a run after config.pbtxt was rewritten loads the rewritten one; a throwaway server reads the repository.
    """
    repository = store.triton_repository_location(prefix)
    environment = store.triton_environment()
    stage = _model_directory_stager(store, f"{prefix}/{model_name}")

    def run(input_sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return run_smoke_inference(
            scratch=scratch(),
            repository=repository,
            environment=environment,
            model_name=model_name,
            input_sets=input_sets,
            log=say,
            stage=stage,
            label=label,
        )

    return run


def _model_directory_stager(store: ObjectStore, folder: str) -> Callable[[Path], None]:
    """Return a function that copies every object under `folder` (`<prefix>/<model>`) of the store into a local
    folder, keeping the relative paths: what the warm verify server loads is what the repository holds."""

    def stage(target: Path) -> None:
        root = folder.rstrip("/") + "/"
        for key in store.list_keys(root):
            store.download_to(key, target / key[len(root) :])

    return stage
