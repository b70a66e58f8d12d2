"""The build pipeline of one attempt: inspect -> configure -> write repository -> verify, with step rows, logs and
a heartbeat."""

from __future__ import annotations

import dataclasses
import logging
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from builds.archives import unpack_archive_in_sandbox
from builds.choices import STEP_ORDER, StepName, StepStatus
from builds.conversion import convert_in_sandbox, inspect_source_in_sandbox, run_source_in_sandbox
from builds.ensembles import check_pipeline, pipeline_from_config
from builds.environments import ENVIRONMENT_FIELD, parse_requirements
from builds.formats import (
    HEAD_BYTES,
    Conversion,
    ConversionHints,
    ModelFormat,
    check_format_allowed,
    detect_format,
    find_model_in_folder,
    format_by_key,
)
from builds.formats.python_model import (
    EXECUTION_ENV_PARAMETER,
    PythonModel,
    PythonModelFormat,
    environment_filename,
    read_python_model,
    read_repository_python_model,
    signature_from_config,
)
from builds.formats.torchscript import output_name
from builds.formats.triton_repository import (
    CONFIGURATION_OPTIONS,
    SERVED_BACKENDS,
    RepositoryModel,
    TritonRepositoryFormat,
    check_served,
    configure_imported,
    name_outputs_as_configured,
    pick_model,
    pytorch_input_specs,
    read_repository,
    refuse_configuration_options,
)
from builds.inspection import ModelSignature
from builds.model_config import (
    GPU_PRODUCT_FIELD,
    GRAPH_INPUTS_FIELD,
    GRAPH_OUTPUTS_FIELD,
    INPUT_SPEC_FIELD,
    MODEL_FILENAME,
    OUTPUT_SPEC_FIELD,
    TENSORRT_VERSION_FIELD,
    TORCH_INPUT_DATATYPES,
    BuildOptions,
    build_model_config,
    parse_build_options,
)
from builds.models import Build, BuildStep, CustomBackend
from builds.packaging import describe_packaging, package_external_data, package_model_file, upload_file
from builds.sandbox import inspect_onnx_in_sandbox
from builds.services import state
from builds.services.backends import backend_for_model, stage_backend
from builds.services.environments import StoredEnvironment, ensure_environment, environment_target
from builds.services.repositories import register_model_versions, register_repository_models
from builds.services.storage import (
    discard_attempt_repositories,
    record_repository_size,
    reserve_repository_storage,
)
from builds.services.submission import building_stale_before
from builds.services.verify_servers import scratch_server, scratch_server_with_backends
from builds.verify_step import (
    SourceReference,
    axis_names_text,
    describe_batching_plan,
    load_samples,
    verify_build,
)
from conch.errors import ConchError, InvalidInput, PayloadTooLarge, QuotaExceeded, Unavailable
from models_registry import services as registry
from models_registry.storage import get_object_store
from tritonserving.config import ModelConfig, config_to_pbtxt, datatype_of_numpy

if TYPE_CHECKING:
    from models_registry.models import ModelVersion

log = logging.getLogger(__name__)


class BuildSuperseded(Exception):
    """The attempt being built was superseded (a rebuild, or the sweeper gave it to another worker)."""


class BuildHeartbeat:
    """Writes the heartbeat of a running build attempt every `interval_s` seconds from a daemon thread.

    Use as a context manager around the build: long steps (a model download, a Triton start) keep
    beating. The thread stops when the block ends or the attempt is superseded; it closes its own
    database connection. A failed write is logged and retried at the next beat.
    """

    def __init__(self, *, version_id: int, attempt: int, interval_s: float) -> None:
        self.version_id = version_id
        self.attempt = attempt
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"conch-build-heartbeat-{version_id}", daemon=True)

    def __enter__(self) -> BuildHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        # A beat stuck on the database must not hold the build's result back; the daemon thread ends with it.
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    if not state.record_build_heartbeat(version_id=self.version_id, attempt=self.attempt):
                        return
                except DatabaseError as error:
                    log.warning("build.heartbeat.failed", extra={"version_id": self.version_id, "error": str(error)})
        finally:
            connections.close_all()  # this thread's connections only


class StepLog:
    """Collects a step's log lines and saves them as they come, so a user can watch."""

    def __init__(self, step: BuildStep) -> None:
        self.step = step

    def __call__(self, line: str) -> None:
        stamp = timezone.now().strftime("%H:%M:%S")
        self.step.log.append(f"{stamp} {line}")
        BuildStep.objects.filter(pk=self.step.pk).update(log=self.step.log)


def reset_steps(*, build: Build) -> list[BuildStep]:
    """Create or reset the four step rows of a build attempt to `pending` (no duplicates; a redelivered task redoes
    the same attempt's steps)."""
    steps = []
    with transaction.atomic():
        for position, name in enumerate(STEP_ORDER):
            step, _ = BuildStep.objects.update_or_create(
                build=build,
                name=name,
                defaults={
                    "position": position,
                    "status": StepStatus.PENDING,
                    "log": [],
                    "started_at": None,
                    "finished_at": None,
                },
            )
            steps.append(step)
    return steps


@contextmanager
def _step(build: Build, name: str) -> Iterator[StepLog]:
    if not state.record_build_heartbeat(version_id=build.version_id, attempt=build.attempt):
        raise BuildSuperseded()
    step = BuildStep.objects.get(build=build, name=name)
    step.status, step.started_at, step.log = StepStatus.RUNNING, timezone.now(), []
    step.save(update_fields=["status", "started_at", "log"])
    started = time.monotonic()
    log_line = StepLog(step)
    try:
        yield log_line
    except ConchError as exc:
        log_line(f"FAILED: {exc.detail}")
        finish_step(step, StepStatus.FAILED)
        raise
    except Exception as exc:
        log_line(f"FAILED: internal error {type(exc).__name__}: {exc}")
        finish_step(step, StepStatus.FAILED)
        raise
    log_line(f"done in {time.monotonic() - started:.2f} s")
    finish_step(step, StepStatus.SUCCEEDED)


def finish_step(step: BuildStep, status: str) -> None:
    step.status, step.finished_at = status, timezone.now()
    step.save(update_fields=["status", "finished_at", "log"])


def skip_remaining_steps(*, version_id: int, attempt: int) -> None:
    """Mark the steps of build `attempt` of a version that did not start as `skipped`."""
    BuildStep.objects.filter(build__version_id=version_id, build__attempt=attempt, status=StepStatus.PENDING).update(
        status=StepStatus.SKIPPED
    )


def run_build(*, version_id: int, attempt: int) -> str:
    """Run build `attempt` of a version; returns the version's final status (or "skipped").

    The attempt is walked through once here: claimed (`state.claim_build`), its four steps run with a heartbeat,
    and its result recorded (`state.record_build_result`); every change of its state goes through
    `builds.services.state`.

    Permanent problems (a bad file, a meaningless option, a model that fails its smoke
    inference) mark the version `failed` with a message naming the field or tensor.
    `Unavailable` (object store or Triton unreachable) puts the version back to `queued` and
    propagates so the task retries. "skipped": the attempt is stale, finished, being built by
    a live worker, or was superseded while it ran. The repository goes under the attempt's own
    prefix (`registry.repository_prefix`), recorded on the attempt on success (the version then serves it).
    """
    build = state.claim_build(version_id=version_id, attempt=attempt, stale_before=building_stale_before())
    if build is None:
        return "skipped"
    with BuildHeartbeat(version_id=version_id, attempt=attempt, interval_s=settings.CONCH_BUILD_HEARTBEAT_SECONDS):
        return _run_claimed_build(build)


def _run_claimed_build(build: Build) -> str:
    version, attempt = build.version, build.attempt
    reset_steps(build=build)
    store = get_object_store()
    model_name = version.model.name
    try:
        with tempfile.TemporaryDirectory(prefix="conch-build-") as tmp:
            work = Path(tmp)
            sandbox_seconds = 0.0
            with _step(build, StepName.INSPECT) as say:
                if build.lost_attempts:
                    say(
                        f"attempt {attempt}: the worker running the previous attempt stopped mid-build (no heartbeat; "
                        f"{build.lost_attempts} attempt(s) lost so far), so the build starts again"
                    )
                say(f"downloading {version.source_key} ({version.source_size_bytes} bytes)")
                uploaded = work / "upload"
                store.download_to(version.source_key, uploaded)
                if not version.source_checked:
                    # A resumable upload's SHA-256 is checked here, on the copy the build reads anyway.
                    say(f"checking sha256 of the uploaded file against {version.source_sha256} (promised at upload)")
                    registry.check_version_source(version=version, path=uploaded)
                    say("checking sha256 … ok")
                model_format, source = _detect(uploaded, version.source_filename, version.source_size_bytes)
                check_format_allowed(model_format, team=version.model.team)
                say(
                    f"format: {model_format.title} (told from the name {version.source_filename!r} and the first bytes)"
                )
                unpacked = model_format.container
                imported: RepositoryModel | None = None
                python_model: PythonModel | None = None
                custom_backend: CustomBackend | None = None
                if unpacked:
                    model_format, source = _unpack(source, work / "unpacked", say)
                    check_format_allowed(model_format, team=version.model.team)
                    if isinstance(model_format, PythonModelFormat):
                        # Recorded now: a build that fails for want of input_spec/output_spec offers them on rebuild.
                        state.record_build_artifacts(
                            version_id=version.pk, attempt=attempt, source_format=model_format.key
                        )
                        python_model = _read_python_model(source, say)
                    if isinstance(model_format, TritonRepositoryFormat):
                        imported, source, custom_backend = _import_repository(version, source, say)
                        if imported.backend == "python":
                            # model.py and its files are its version folder; config.pbtxt gives its tensors.
                            model_format = format_by_key("python")
                            state.record_build_artifacts(
                                version_id=version.pk, attempt=attempt, source_format=model_format.key
                            )
                            python_model = _read_python_model(
                                source.parent, say, config=imported.config, model_folder=imported.folder
                            )
                            source = source.parent
                        if imported.backend == "pytorch":
                            # Its model.pt is TorchScript, read and served as an upload of it is; config.pbtxt
                            # gives what TorchScript does not record (its inputs' datatypes and shapes).
                            model_format = format_by_key("torchscript")
                hints = _conversion_hints(model_format, parse_build_options(build.options))
                conversion: Conversion | None = None
                if python_model is not None:
                    local = source
                    signature = _python_signature(python_model, build, say)
                elif custom_backend is not None and imported is not None:
                    local = source  # its version folder, served as it is by the backend
                    signature = ModelSignature.from_dict(
                        signature_from_config(imported.config, what=f"model {imported.name!r} of backend")
                    )
                    say(
                        f"served by the team's backend {custom_backend.name} {custom_backend.version} "
                        f"({custom_backend.get_kind_display()}); its inputs and outputs as config.pbtxt configures them"
                    )
                elif model_format.declares_interface:
                    local = source
                    signature = _declared_signature(model_format, source, build, say)
                elif not model_format.serves_onnx:
                    local = source
                    started = time.monotonic()
                    signature, conversion = _inspect_source(
                        model_format,
                        source,
                        build,
                        store,
                        say,
                        specs=pytorch_input_specs(imported) if imported is not None else None,
                    )
                    if imported is not None:
                        signature = name_outputs_as_configured(imported, signature)
                    sandbox_seconds = time.monotonic() - started
                elif model_format.converted:
                    local = work / "model.onnx"
                    say(f"converting to ONNX with {model_format.converter} in the sandbox")
                    started = time.monotonic()
                    conversion = convert_in_sandbox(model_format, source, local, hints=hints)
                    sandbox_seconds = time.monotonic() - started
                    for line in conversion.describe():
                        say(line)
                    say(f"conversion took {sandbox_seconds:.2f} s in all, the sandbox's start included")
                else:
                    local = source
                if model_format.serves_onnx and custom_backend is None:
                    signature = inspect_onnx_in_sandbox(local)
                for kind, tensors in (("input", signature.inputs), ("output", signature.outputs)):
                    for t in tensors:
                        say(f"{kind} {t.name}: {t.datatype} {list(t.dims)}{axis_names_text(t.dim_names)}")
                state.record_build_artifacts(
                    version_id=version.pk,
                    attempt=attempt,
                    signature=signature.to_dict(),
                    source_format=model_format.key,
                    conversion={**conversion.to_dict(), "wall_seconds": round(sandbox_seconds, 3)}
                    if conversion
                    else None,
                )

            with _step(build, StepName.CONFIGURE) as say:
                options = parse_build_options(build.options)
                if model_format.declares_interface and options.max_batch_size is None:
                    # A plan's batch range is its optimization profile's, which Conch cannot read: Triton batches
                    # it only up to a max_batch_size the uploader gives (at most the profile's largest batch).
                    options = dataclasses.replace(options, max_batch_size=0)
                    say(
                        "batching off: a TensorRT plan batches within its optimization profile, which only "
                        "TensorRT can read; rebuild with max_batch_size (at most the profile's largest batch) to "
                        "batch"
                    )
                if python_model is not None and imported is None and options.max_batch_size is None:
                    configured = python_model.configured_max_batch_size
                    if configured is not None:
                        options = dataclasses.replace(options, max_batch_size=configured)
                        say(f"max_batch_size={configured}, as the archive's config.pbtxt sets it")
                if imported is not None:
                    config, options = _configure_imported(
                        imported,
                        model_name,
                        signature,
                        options,
                        say,
                        model_format=model_format,
                        model_filename=imported.model_filename if custom_backend is not None else None,
                    )
                else:
                    config = build_model_config(
                        name=model_name,
                        signature=signature,
                        options=options,
                        backend=model_format.served_as,
                        model_filename=model_format.model_filename,
                    )
                if python_model is not None:
                    say(
                        "the Python backend will run model.py in the execution environment the next step builds "
                        f"from requirements.txt (parameter {EXECUTION_ENV_PARAMETER})"
                    )
                pbtxt = config_to_pbtxt(config)
                state.record_build_artifacts(version_id=version.pk, attempt=attempt, config_pbtxt=pbtxt)
                if imported is None:
                    for line in describe_batching_plan(signature, options, config):
                        say(line)

            # The repository's model file is a copy of the stored upload when that is the model as uploaded;
            # a converted model, or one unpacked from an archive, is uploaded from the local file.
            copy_key = (
                None if model_format.converted or unpacked or model_format.declares_interface else version.source_key
            )
            prefix = registry.repository_prefix(model_id=version.model_id, number=version.number, attempt=attempt)
            with _step(build, StepName.WRITE_REPOSITORY) as say:
                model_key = f"{prefix}/{model_name}/{version.number}/{model_format.model_filename}"
                data_files: dict[str, int] = {}
                if python_model is not None:
                    size, pbtxt = _write_python_model(build, python_model, store, prefix, config, say)
                    local = python_model.folder / model_format.model_filename
                elif custom_backend is not None:
                    size = _write_custom_backend_model(build, custom_backend, local, store, prefix, pbtxt, say)
                else:
                    size = local.stat().st_size + len(pbtxt.encode()) + _external_data_bytes(local, signature)
                    reserve_repository_storage(version=version, attempt=attempt, prefix=prefix, size_bytes=size)
                    packaged = package_model_file(
                        store=store,
                        # A converted model is uploaded from the local file; an ONNX upload is copied in the store.
                        source_key=copy_key,
                        source_file=local,
                        model_key=model_key,
                        config=config,
                        signature=signature,
                    )
                    data_files = package_external_data(
                        store=store, source_file=local, model_key=model_key, files=signature.external_data_files
                    )
                    store.put_bytes(f"{prefix}/{model_name}/config.pbtxt", pbtxt.encode())
                    say(f"wrote {prefix}/{model_name}/config.pbtxt and {model_key} ({size} bytes)")
                    for key, data_bytes in data_files.items():
                        say(f"wrote {key} ({data_bytes} bytes): external data of the model, beside it")
                    for line in describe_packaging(packaged, model_key):
                        say(line)

            with _step(build, StepName.VERIFY) as say:
                if not model_format.verifiable_here:
                    say(
                        f"not verified here: {_a(model_format.title)} runs only on the GPU product and TensorRT "
                        "version it was built for, and the verify Triton has no GPU. A deployment on a matching GPU "
                        "loads it (a plan that does not fit fails that deployment's start with Triton's reason)."
                    )
                    verified = config
                else:
                    verified = _verify(
                        python_model is not None,
                        build=build,
                        record_config=lambda pbtxt: state.record_build_artifacts(
                            version_id=version.pk, attempt=attempt, config_pbtxt=pbtxt
                        ),
                        store=store,
                        prefix=prefix,
                        config=config,
                        signature=signature,
                        options=options,
                        say=say,
                        scratch=scratch_server
                        if custom_backend is None
                        else _scratch_with_backend(custom_backend, work / "custom-backend"),
                        source_file=local,
                        source_key=copy_key,
                        reference=_reference(
                            model_format,
                            source,
                            build,
                            conversion,
                            sandbox_seconds,
                            hints,
                            output_names={output_name(i): t.name for i, t in enumerate(signature.outputs)}
                            if imported is not None and imported.backend == "pytorch"
                            else None,
                        ),
                    )
                if python_model is not None or custom_backend is not None:  # its files as written; config as kept
                    stored = size - len(pbtxt.encode()) + len(config_to_pbtxt(verified).encode())
                else:
                    stored = store.size(model_key) + len(config_to_pbtxt(verified).encode()) + sum(data_files.values())
                if stored != size:  # verify rewrote config.pbtxt or the model file's outputs: count what is stored
                    record_repository_size(version_id=version.pk, attempt=attempt, size_bytes=stored)
    except BuildSuperseded:
        log.info("build.superseded", extra={"version_id": version.pk, "attempt": attempt})
        return "skipped"
    except Unavailable:
        state.release_build(version_id=version.pk, attempt=attempt)
        raise
    except (InvalidInput, QuotaExceeded, PayloadTooLarge) as exc:
        skip_remaining_steps(version_id=version.pk, attempt=attempt)
        error = exc.detail
        if isinstance(exc, QuotaExceeded):
            error += (
                ". Delete versions the team no longer needs (DELETE /api/v1/versions/{id}/) or ask a platform admin "
                "for more storage, then rebuild."
            )
        if state.record_build_result(
            version_id=version.pk, attempt=attempt, succeeded=False, error=error, error_field=exc.field or ""
        ):
            _discard_failed_attempt(version.pk, attempt)
        log.info("build.failed", extra={"version_id": version.pk, "error": exc.detail})
        return "failed"
    except Exception as exc:
        skip_remaining_steps(version_id=version.pk, attempt=attempt)
        if state.record_build_result(
            version_id=version.pk,
            attempt=attempt,
            succeeded=False,
            error=f"Internal error during the build ({type(exc).__name__}: {exc}). Retry with rebuild; "
            "if it persists, report it.",
        ):
            _discard_failed_attempt(version.pk, attempt)
        raise
    state.record_build_result(version_id=version.pk, attempt=attempt, succeeded=True, repository_prefix=prefix)
    log.info("build.succeeded", extra={"version_id": version.pk, "attempt": attempt, "prefix": prefix})
    return "built"


def _a(title: str) -> str:
    """`title` with its indefinite article ("an ONNX model", "a TensorRT plan")."""
    return f"{'an' if title[:1] in 'AEIOX' else 'a'} {title}"


def _declared_signature(model_format: ModelFormat, source: Path, build: Build, say: StepLog) -> ModelSignature:
    """The signature a TensorRT plan's upload declares (`ModelFormat.declared_signature`), its local copy made the
    file Triton loads (`ModelFormat.prepare`). Raises InvalidInput naming the missing declaration."""
    signature, notes = model_format.declared_signature(parse_build_options(build.options))
    note = model_format.prepare(source)
    if note:
        say(note)
    for line in notes:
        say(f"assumed: {line}")
    return ModelSignature.from_dict(signature)


def _verify(python_model: bool, **arguments: Any) -> ModelConfig:
    """`verify_build(**arguments)`; for a Python model, a load that failed on a missing module says to list the
    package in requirements.txt (the environment holds numpy and what requirements.txt names, nothing of Conch's)."""
    try:
        return verify_build(**arguments)
    except InvalidInput as exc:
        missing = re.search(r"No module named '([^']+)'", exc.detail) if python_model else None
        if missing is None:
            raise
        package = missing.group(1).split(".")[0]
        raise InvalidInput(
            f"{exc.detail} model.py imports {package!r}, which its environment does not hold: the environment has "
            "numpy and what requirements.txt names, nothing of Conch's own. Add the package that provides "
            f"{package!r} to requirements.txt and upload the archive again.",
            field=ENVIRONMENT_FIELD,
        ) from exc


def _read_python_model(
    folder: Path, say: StepLog, *, config: ModelConfig | None = None, model_folder: Path | None = None
) -> PythonModel:
    """Read and check the Python model in `folder` (`read_python_model`: model.py parsed, never run; with `config`,
    a repository's python model whose version folder `folder` is: `read_repository_python_model`) and its
    requirements.txt (`parse_requirements`), logging what was found. Raises InvalidInput naming the file or line."""
    if config is not None:
        model = read_repository_python_model(folder, config, model_folder or folder.parent)
    else:
        model = read_python_model(folder)
    say(
        f"model.py defines TritonPythonModel with {', '.join(model.methods)} (read with ast; the code runs only "
        f"inside Triton); {len(model.files)} file(s) go into the version folder"
    )
    if model.requirements:
        requirements = parse_requirements(model.requirements)
        say(f"requirements.txt: {', '.join(requirements)}")
    else:
        say("no requirements.txt: the environment holds numpy only (the Python backend needs it)")
    if model.config is not None:
        say("config.pbtxt: inputs, outputs and max_batch_size are taken from it")
    return model


def _python_signature(model: PythonModel, build: Build, say: StepLog) -> ModelSignature:
    """A Python model's signature from its config.pbtxt or the build options input_spec/output_spec
    (`PythonModel.signature`). Raises InvalidInput naming the option or the config.pbtxt field."""
    options = parse_build_options(build.options)
    signature = ModelSignature.from_dict(
        model.signature(input_spec=options.input_spec, output_spec=options.output_spec)
    )
    if model.config is None:
        say("inputs and outputs as input_spec and output_spec declare them")
    return signature


def _write_python_model(
    build: Build, model: PythonModel, store: Any, prefix: str, config: ModelConfig, say: StepLog
) -> tuple[int, str]:
    """Write a Python model's repository under `prefix`: its files in `<model>/<version>/`, its execution environment
    (built or reused: `ensure_environment`) beside config.pbtxt as `<model>/python_env-<key>.tar.gz` (named by its
    key, so that versions with different environments live side by side during a hot update), and config.pbtxt
    naming it (`EXECUTION_ENV_PATH`, set on `config` here). Returns the bytes written, which the team's storage
    quota counts, and the configuration text. Raises what `ensure_environment` raises (InvalidInput, field
    "requirements"; PayloadTooLarge; Unavailable), QuotaExceeded, and the store's errors."""
    version = build.version
    model_name = config.name
    environment = ensure_environment(store, model.requirements, say)
    filename = environment_filename(environment.key)
    config.parameters[EXECUTION_ENV_PARAMETER].string_value = f"$$TRITON_MODEL_DIRECTORY/{filename}"
    pbtxt = config_to_pbtxt(config)
    state.record_build_artifacts(
        version_id=version.pk,
        attempt=build.attempt,
        config_pbtxt=pbtxt,
        environment=_environment_record(environment),
    )
    files = {name: (model.folder / name).stat().st_size for name in model.files}
    size = sum(files.values()) + environment.size_bytes + len(pbtxt.encode())
    reserve_repository_storage(version=version, attempt=build.attempt, prefix=prefix, size_bytes=size)
    folder = f"{prefix}/{model_name}"
    _upload_files(store, model.folder, model.files, f"{folder}/{version.number}")
    store.copy(environment.object_key, f"{folder}/{filename}")
    store.put_bytes(f"{folder}/config.pbtxt", pbtxt.encode())
    say(
        f"wrote {folder}/config.pbtxt, {len(files)} file(s) in {folder}/{version.number}/ "
        f"({sum(files.values())} bytes) and {folder}/{filename} ({environment.size_bytes} bytes)"
    )
    return size, pbtxt


def _check_repository_ensemble(ensemble: RepositoryModel, models: Sequence[RepositoryModel], say: StepLog) -> None:
    """Check an uploaded repository's ensemble as a pipeline (`builds.ensembles.check_pipeline`: datatypes and shapes
    through its steps, unconnected and unused tensors, cycles, batch sizes) against its steps' config.pbtxt, when
    each of them configures its inputs and outputs (a step left to auto-complete is not checked). Raises
    InvalidInput (field "steps") naming every problem."""
    steps = {m.name: m for m in models if m.name != ensemble.name}
    spec = pipeline_from_config(ensemble.config)
    unconfigured = sorted(
        step.model
        for step in spec.steps
        if step.model in steps and not (steps[step.model].config.input and steps[step.model].config.output)
    )
    if unconfigured:
        say(
            f"ensemble {ensemble.name!r}: not checked, since config.pbtxt of {', '.join(unconfigured)} leaves its "
            "inputs and outputs to Triton's auto-complete"
        )
        return
    checked = check_pipeline(spec, {name: model.config for name, model in steps.items()})
    say(f"ensemble {ensemble.name!r}: its {len(checked.order)} steps agree ({' -> '.join(checked.order)})")


def _upload_files(store: Any, folder: Path, names: Sequence[str], prefix: str) -> int:
    """Upload the files `names` (relative to `folder`) under `prefix`; return their bytes."""
    total = 0
    for name in names:
        upload_file(store, folder / name, f"{prefix}/{name}")
        total += (folder / name).stat().st_size
    return total


def _write_custom_backend_model(
    build: Build, backend: CustomBackend, folder: Path, store: Any, prefix: str, pbtxt: str, say: StepLog
) -> int:
    """Write a model of a team's custom backend under `prefix`: every file of its version folder `folder` as it is,
    and config.pbtxt; record the backend version it is built with (`Build.backend`). Returns the bytes written.
    Raises QuotaExceeded and the store's errors."""
    version = build.version
    names = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())
    size = sum((folder / name).stat().st_size for name in names) + len(pbtxt.encode())
    reserve_repository_storage(version=version, attempt=build.attempt, prefix=prefix, size_bytes=size)
    model_folder = f"{prefix}/{version.model.name}"
    _upload_files(store, folder, names, f"{model_folder}/{version.number}")
    store.put_bytes(f"{model_folder}/config.pbtxt", pbtxt.encode())
    Build.objects.filter(pk=build.pk).update(
        backend={
            "id": backend.pk,
            "name": backend.name,
            "version": backend.version,
            "kind": backend.kind,
            "files_prefix": backend.files_prefix,
        }
    )
    say(
        f"wrote {model_folder}/config.pbtxt and {len(names)} file(s) in {model_folder}/{version.number}/ ({size} bytes)"
    )
    return size


def _scratch_with_backend(backend: CustomBackend, folder: Path) -> Callable[[], Any]:
    """The verify server for a model of `backend`: a throwaway one whose backend directory has it (staged into
    `folder` from the store once)."""

    def scratch() -> Any:
        if not folder.exists():
            stage_backend(backend.files_prefix, folder, label=f"{backend.name} {backend.version}")
        return scratch_server_with_backends({backend.name: (backend.files_prefix, folder)})

    return scratch


def _environment_record(environment: StoredEnvironment) -> dict[str, Any]:
    return {
        "key": environment.key,
        "size_bytes": environment.size_bytes,
        "reused": environment.reused,
        "target": environment_target().to_dict(),
        "pins": [pin.to_dict() for pin in environment.pins],
    }


def _detect(uploaded: Path, filename: str, size_bytes: int) -> tuple[ModelFormat, Path]:
    """The stored upload's format (`builds.formats.detect_format`: its name and first bytes), and the local copy
    renamed as its format reads it (`ModelFormat.local_name`). Raises InvalidInput (field "file")."""
    with uploaded.open("rb") as handle:
        head = handle.read(HEAD_BYTES)
    model_format = detect_format(head, filename=filename, size_bytes=size_bytes)
    source = uploaded.with_name(model_format.local_name(head))
    uploaded.rename(source)
    return model_format, source


def _conversion_hints(model_format: ModelFormat, options: BuildOptions) -> ConversionHints:
    """The interface hints the build options give (`graph_inputs`, `graph_outputs`). Raises InvalidInput naming the
    option when it is given for a format that takes none (`ModelFormat.hint_options`): also `input_spec` (a
    TorchScript model's or a TensorRT plan's) and a plan's `output_spec`, `gpu_product`, `tensorrt_version`."""
    given = {
        GRAPH_INPUTS_FIELD: options.graph_inputs,
        GRAPH_OUTPUTS_FIELD: options.graph_outputs,
        INPUT_SPEC_FIELD: options.input_spec,
        OUTPUT_SPEC_FIELD: options.output_spec,
        GPU_PRODUCT_FIELD: options.gpu_product,
        TENSORRT_VERSION_FIELD: options.tensorrt_version,
    }
    for field, value in given.items():
        if value and field not in model_format.hint_options:
            what = {
                GRAPH_INPUTS_FIELD: "names the nodes of a TensorFlow frozen graph (.pb)",
                GRAPH_OUTPUTS_FIELD: "names the nodes of a TensorFlow frozen graph (.pb)",
                INPUT_SPEC_FIELD: "gives a TorchScript model's or a TensorRT plan's inputs (.pt, .plan)",
            }.get(field, "describes a TensorRT plan (.plan)")
            raise InvalidInput(
                f"{field} {what}, but this model is {_a(model_format.title)}, whose file says its "
                "inputs and outputs itself. Leave it empty and rebuild.",
                field=field,
            )
    if not isinstance(model_format, PythonModelFormat):
        for field, spec in ((INPUT_SPEC_FIELD, options.input_spec), (OUTPUT_SPEC_FIELD, options.output_spec)):
            strings = [name for name, (datatype, _) in (spec or {}).items() if datatype == "BYTES"]
            if strings:
                raise InvalidInput(
                    f"{field} gives {strings[0]!r} the datatype BYTES, which only a Python model's tensors may have; "
                    f"{_a(model_format.title)} takes numbers: give one of {', '.join(TORCH_INPUT_DATATYPES)}.",
                    field=field,
                )
    return ConversionHints(inputs=options.graph_inputs or (), outputs=options.graph_outputs or ())


def _inspect_source(
    model_format: ModelFormat,
    source: Path,
    build: Build,
    store: Any,
    say: StepLog,
    *,
    specs: dict[str, tuple[str, tuple[int, ...]]] | None = None,
) -> tuple[ModelSignature, Conversion]:
    """Read a model served as uploaded by a backend other than onnxruntime (TorchScript) with its own framework in
    the sandbox (`inspect_source_in_sandbox`); return its signature and report. Its inputs' datatypes and shapes
    come from `specs` (a repository model's config.pbtxt), else the `input_spec` option, else the sample inputs
    (their dtype and shape, axis 0 any size). Raises InvalidInput naming input_spec or the file."""
    options = parse_build_options(build.options)
    from_samples = specs is None and options.input_spec is None
    if specs is not None:
        say(f"inputs as config.pbtxt configures them: {', '.join(specs)}")
    elif options.input_spec is not None:
        specs = {name: (datatype, tuple(dims)) for name, (datatype, dims) in options.input_spec.items()}
    else:
        arrays = load_samples(store, build.options or {}).arrays
        specs = {
            name: (datatype_of_numpy(array.dtype), (-1, *array.shape[1:]) if array.ndim else ())
            for name, array in arrays.items()
        }
    say(f"reading the {model_format.title} with its own framework in the sandbox")
    raw, report = inspect_source_in_sandbox(model_format, source, specs=specs, from_samples=from_samples)
    say(
        f"read with {report.source} in {report.seconds:.2f} s; served as uploaded by Triton's "
        f"{model_format.served_as} backend"
    )
    for note in report.notes:
        say(f"assumed: {note}")
    return ModelSignature.from_dict(raw), report


def _unpack(archive: Path, folder: Path, say: StepLog) -> tuple[ModelFormat, Path]:
    """Unpack the uploaded archive into `folder` in the sandbox (`builds.archives`, with its caps); return the format
    of the model it holds and its entry (`builds.formats.find_model_in_folder`). Raises InvalidInput (field "file")
    naming the member or saying what the archive holds instead."""
    say("unpacking the archive in the sandbox")
    unpacked = unpack_archive_in_sandbox(archive, folder)
    say(
        f"unpacked the {unpacked.kind} archive: {len(unpacked.files)} file(s), {unpacked.unpacked_bytes} bytes"
        + (f"; skipped {len(unpacked.skipped)} macOS resource file(s)" if unpacked.skipped else "")
    )
    model_format, entry = find_model_in_folder(folder, unpacked.files)
    where = entry.relative_to(folder).as_posix()
    say(f"the archive holds {model_format.title}" + (f": {where}" if where != "." else " at its top"))
    return model_format, entry


def _import_repository(
    version: ModelVersion, root: Path, say: StepLog
) -> tuple[RepositoryModel, Path, CustomBackend | None]:
    """Read and check every model of the uploaded Triton model repository at `root`
    (`builds.formats.triton_repository.read_repository`); return the model this build serves (the one named as
    the Conch model, or the only one) and its model file: the lowest version its version policy serves; each other
    version it serves becomes the Conch model's next version, in order (`register_model_versions`). The
    repository's other models become models of the team, each with a version built from its folder
    (`builds.services.repositories.register_repository_models`).
    Raises InvalidInput (field "file") naming the model and the field; Unavailable as registering does."""
    model_name = version.model.name
    models = read_repository(root, lone_name=model_name)
    say(
        f"Triton model repository of {len(models)} model(s): every config.pbtxt parsed with Triton's "
        "model_config.proto and checked against its folder"
    )
    for model in models:
        say(model.describe())
        for skipped in model.skipped:
            say(f"model {model.name!r}: skipped {skipped}, as Triton does")
    chosen = pick_model(models, model_name)
    custom = None
    if chosen.backend == "ensemble":
        _check_repository_ensemble(chosen, models, say)
    if chosen.backend not in SERVED_BACKENDS and chosen.backend != "ensemble":
        custom = backend_for_model(team_id=version.model.team_id, name=chosen.backend)
    if custom is None:
        check_served(chosen)
    number = chosen.versions[0]
    if len(chosen.versions) > 1:
        say(
            f"model {chosen.name!r} serves versions {', '.join(str(v) for v in chosen.versions)}: this Conch version "
            f"is its version {number}, and each other one becomes the next version of {model_name!r}, in order"
        )
    say(f"building {chosen.name}/{number}/{chosen.model_filename} as its config.pbtxt configures it")
    register_repository_models(version=version, models=models, served=chosen, say=say)
    register_model_versions(version=version, model=chosen, served=number, say=say)
    return chosen, chosen.model_file(number), custom


def _configure_imported(
    model: RepositoryModel,
    model_name: str,
    signature: ModelSignature,
    options: BuildOptions,
    say: StepLog,
    *,
    model_format: ModelFormat,
    model_filename: str | None = None,
) -> tuple[ModelConfig, BuildOptions]:
    """The configuration of a repository model (`configure_imported`: its config.pbtxt, checked against the model
    file) and the options verify proves it with: the batching it configures must be safe, or the build fails.
    Raises InvalidInput naming a build option that config.pbtxt sets instead, or the model, tensor and field."""
    refuse_configuration_options({option: getattr(options, option) for option in CONFIGURATION_OPTIONS})
    config, notes = configure_imported(
        model,
        name=model_name,
        signature=signature,
        model_filename=model_filename if model_filename is not None else model_format.model_filename or MODEL_FILENAME,
        backend=model.backend,
    )
    for note in notes:
        say(f"config.pbtxt: {note}")
    batcher = "on" if config.HasField("dynamic_batching") else "off"
    say(f"as configured: max_batch_size={config.max_batch_size} dynamic_batching={batcher}")
    if config.max_batch_size > 0:
        say(
            "batching: verify will prove that joining requests on axis 0 gives each its own outputs, or the build fails"
        )
    return config, BuildOptions(max_batch_size=config.max_batch_size or None, tolerance=options.tolerance)


def _external_data_bytes(model_file: Path, signature: ModelSignature) -> int:
    """Bytes of the external data files `signature` names, beside `model_file` (0 for a self-contained model)."""
    return sum((model_file.parent / location).stat().st_size for location in signature.external_data_files)


def _reference(
    model_format: ModelFormat,
    source: Path,
    build: Build,
    conversion: Conversion | None,
    wall_seconds: float,
    hints: ConversionHints,
    *,
    output_names: dict[str, str] | None = None,
) -> SourceReference | None:
    """How verify runs the source framework and records the comparison, for a converted model (None otherwise).

    The build's `conversion` then holds the conversion report, `wall_seconds` (the conversion with the sandbox's
    start), `comparison` (per output) and `comparison_seconds` (the source framework's run, sandbox included).
    `output_names` renames the source framework's outputs to the served model's (a repository's TorchScript model,
    whose config.pbtxt names them)."""
    if conversion is None:
        return None
    report = {**conversion.to_dict(), "wall_seconds": round(wall_seconds, 3)}

    def record(comparisons: list[dict[str, Any]], seconds: float) -> None:
        report["comparison"] = comparisons
        report["comparison_seconds"] = round(seconds, 3)
        state.record_build_artifacts(version_id=build.version_id, attempt=build.attempt, conversion=report)

    return SourceReference(
        title=model_format.title,
        run=lambda inputs: {
            (output_names or {}).get(name, name): array
            for name, array in run_source_in_sandbox(model_format, source, inputs, hints=hints).items()
        },
        record=record,
        converted=model_format.converted,
    )


def _discard_failed_attempt(version_id: int, attempt: int) -> None:
    """Delete what failed build `attempt` wrote (its repository; `discard_attempt_repositories`), so a failed version
    counts its uploaded file only. A store that fails now leaves it to `collect_repository_garbage`."""
    try:
        discard_attempt_repositories(version_id=version_id, attempts=[attempt])
    except ConchError as error:
        log.warning("build.repository.discard_failed", extra={"version_id": version_id, "error": error.detail})


def fail_build_after_retries(*, version_id: int, attempt: int, detail: str) -> None:
    """Mark a build failed once its transient errors outlived the task's retries, and delete what it wrote."""
    skip_remaining_steps(version_id=version_id, attempt=attempt)
    if state.record_build_result(
        version_id=version_id,
        attempt=attempt,
        succeeded=False,
        error=f"{detail} The build gave up after retrying; start it again with rebuild.",
    ):
        _discard_failed_attempt(version_id, attempt)
