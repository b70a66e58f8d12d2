"""The build pipeline: inspect -> configure -> write repository -> verify.

`run_build` turns a version's uploaded ONNX file into a Triton model repository in the
object store and proves it serves. Each step has a `BuildStep` row with its status and
log lines. A build is idempotent: it is keyed by (version, attempt), writes only under
the version's own repository prefix (deleting what an earlier attempt left there), and
a redelivered task simply does the same work again.
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from builds.choices import STEP_ORDER, StepName, StepStatus
from builds.inspection import inspect_onnx
from builds.model_config import build_model_config, parse_build_options
from builds.models import BuildStep
from builds.verification import describe_sample_arrays, parse_sample_values, read_sample_arrays
from builds.verify_step import axis_names_text, describe_batching_plan, verify_build
from conch.errors import ConchError, InvalidInput, Unavailable
from models_registry import services as registry
from models_registry.storage import ObjectStore, StoredObject, get_object_store
from tritonserving.config import config_to_pbtxt
from tritonserving.smoke import ScratchServer

if TYPE_CHECKING:
    from models_registry.models import ModelVersion

log = logging.getLogger(__name__)

#: Server ids of verify servers are "<CONCH_INSTANCE_ID>.verify.<hex>" (see deployments' ".dep." ids); instance
#: ids may not contain ".", so one installation's prefix never matches another's.
SERVER_ID_INFIX_VERIFY = ".verify."


class StepLog:
    """Collects a step's log lines and saves them as they come, so a user can watch."""

    def __init__(self, step: BuildStep) -> None:
        self.step = step

    def __call__(self, line: str) -> None:
        stamp = timezone.now().strftime("%H:%M:%S")
        self.step.log.append(f"{stamp} {line}")
        BuildStep.objects.filter(pk=self.step.pk).update(log=self.step.log)


def reset_steps(*, version: ModelVersion) -> list[BuildStep]:
    """Create or reset the four step rows of a version to `pending` (no duplicates)."""
    steps = []
    with transaction.atomic():
        for position, name in enumerate(STEP_ORDER):
            step, _ = BuildStep.objects.update_or_create(
                version=version,
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
def _step(version: ModelVersion, name: str) -> Iterator[StepLog]:
    step = BuildStep.objects.get(version=version, name=name)
    step.status, step.started_at, step.log = StepStatus.RUNNING, timezone.now(), []
    step.save(update_fields=["status", "started_at", "log"])
    started = time.monotonic()
    log_line = StepLog(step)
    try:
        yield log_line
    except ConchError as exc:
        log_line(f"FAILED: {exc.detail}")
        _finish(step, StepStatus.FAILED)
        raise
    except Exception as exc:
        log_line(f"FAILED: internal error {type(exc).__name__}: {exc}")
        _finish(step, StepStatus.FAILED)
        raise
    log_line(f"done in {time.monotonic() - started:.2f} s")
    _finish(step, StepStatus.SUCCEEDED)


def _finish(step: BuildStep, status: str) -> None:
    step.status, step.finished_at = status, timezone.now()
    step.save(update_fields=["status", "finished_at", "log"])


def _skip_remaining(version_id: int) -> None:
    BuildStep.objects.filter(version_id=version_id, status=StepStatus.PENDING).update(status=StepStatus.SKIPPED)


def queue_build(*, version_id: int, attempt: int) -> None:
    """Queue build `attempt` of a version once the current transaction commits."""
    # By task name: tasks import this module, so importing them here would close a cycle.
    transaction.on_commit(lambda: current_app.signature("builds.build_version", args=(version_id, attempt)).delay())


def submit_upload(
    *,
    version: ModelVersion,
    stored: StoredObject,
    filename: str,
    options: Mapping[str, Any],
    sample_inputs: StoredObject | None = None,
    sample_values: Any = None,
) -> ModelVersion:
    """Record a finished upload with its build options and sample inputs, and queue its first build.

    `options` are the raw form fields (max_batch_size, max_queue_delay_microseconds, preferred_batch_size,
    instance_count). `sample_inputs` is an `.npz` the view streamed to the version's incoming samples key
    (`registry.sample_inputs_key(incoming=True)`); `sample_values` the raw `sample_values` field ("sr=16000" or a
    JSON object). Verify uses them instead of generated inputs. Raises InvalidInput naming the option at fault,
    `sample_inputs`, `sample_values` or `file` (empty file); nothing is queued then, and the caller discards the
    upload (`registry.discard_upload` also deletes the samples).
    """
    parsed = parse_build_options(options)
    build_options = parsed.to_dict()
    store = get_object_store()
    samples = _accept_samples(store, version, {}, sample_inputs, sample_values, move=True)
    if samples:
        build_options["samples"] = samples
    with transaction.atomic():
        version = registry.complete_upload(
            version=version, stored=stored, filename=filename, build_options=build_options
        )
        queue_build(version_id=version.pk, attempt=version.build_attempt)
    return version


def request_rebuild(
    *, version: ModelVersion, sample_inputs: StoredObject | None = None, sample_values: Any = None
) -> ModelVersion:
    """Build a version again from its stored file (after a fix in Conch, a transient failure, or to add samples).

    `sample_inputs` / `sample_values` as for `submit_upload`: each one given replaces what the version had (an
    empty `sample_values` text removes the values); None keeps it. Raises InvalidInput (field `sample_inputs` or
    `sample_values`) for bad samples, Conflict while the upload is unfinished or a build is queued or running; the
    version's samples are unchanged then.
    """
    store = get_object_store()
    build_options = dict(version.build_options or {})
    previous = build_options.get("samples") or {}
    samples = _accept_samples(store, version, previous, sample_inputs, sample_values, move=False)
    build_options.pop("samples", None)
    if samples:
        build_options["samples"] = samples
    with transaction.atomic():
        version = registry.mark_rebuild(version=version, build_options=build_options)
        if sample_inputs is not None:
            store.copy(sample_inputs.key, samples["key"])
        queue_build(version_id=version.pk, attempt=version.build_attempt)
    if sample_inputs is not None:
        store.delete(sample_inputs.key)
    return version


def _accept_samples(
    store: ObjectStore,
    version: ModelVersion,
    previous: Mapping[str, Any],
    sample_inputs: StoredObject | None,
    sample_values: Any,
    *,
    move: bool,
) -> dict[str, Any]:
    """Check uploaded samples and return their description for `build_options["samples"]` ({} when none).

    Description: {"key": object key of the .npz, "inputs": {name: {"dtype", "shape"}}, "values": {name: value}}.
    With `move` (an upload) the checked `.npz` goes from its incoming key to the version's samples key at once;
    a rebuild copies it only once the rebuild is accepted (see `request_rebuild`).
    """
    samples = dict(previous)
    if sample_values is not None:
        values = parse_sample_values(sample_values)
        samples.pop("values", None)
        if values:
            samples["values"] = values
    if sample_inputs is not None:
        arrays = read_sample_arrays(store.read_bytes(sample_inputs.key))
        samples["key"] = registry.sample_inputs_key(model_id=version.model_id, number=version.number)
        samples["inputs"] = describe_sample_arrays(arrays)
        if move:
            store.copy(sample_inputs.key, samples["key"])
            store.delete(sample_inputs.key)
    return samples


def _scratch_server() -> ScratchServer:
    return ScratchServer(
        work_dir=Path(settings.CONCH_TRITON_DIR),
        server_id=f"{settings.CONCH_INSTANCE_ID}{SERVER_ID_INFIX_VERIFY}{uuid.uuid4().hex[:12]}",
        bind_address=settings.CONCH_TRITON_BIND_ADDRESS,
        start_timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS,
    )


def run_build(*, version_id: int, attempt: int) -> str:
    """Run build `attempt` of a version; returns the version's final status.

    Permanent problems (a bad file, a meaningless option, a model that fails its smoke
    inference) mark the version `failed` with a message naming the field or tensor.
    `Unavailable` (object store or Triton unreachable) propagates so the task retries.
    """
    version = registry.claim_build(version_id=version_id, attempt=attempt)
    if version is None:
        return "skipped"
    reset_steps(version=version)
    store = get_object_store()
    model_name = version.model.name
    try:
        with tempfile.TemporaryDirectory(prefix="conch-build-") as tmp:
            local = Path(tmp) / "model.onnx"
            with _step(version, StepName.INSPECT) as say:
                say(f"downloading {version.source_key} ({version.source_size_bytes} bytes)")
                store.download_to(version.source_key, local)
                signature = inspect_onnx(local)
                for kind, tensors in (("input", signature.inputs), ("output", signature.outputs)):
                    for t in tensors:
                        say(f"{kind} {t.name}: {t.datatype} {list(t.dims)}{axis_names_text(t.dim_names)}")
                registry.record_build_artifacts(version_id=version.pk, signature=signature.to_dict())

            with _step(version, StepName.CONFIGURE) as say:
                options = parse_build_options(version.build_options)
                config = build_model_config(name=model_name, signature=signature, options=options)
                pbtxt = config_to_pbtxt(config)
                registry.record_build_artifacts(version_id=version.pk, config_pbtxt=pbtxt)
                for line in describe_batching_plan(signature, options, config):
                    say(line)

            prefix = version.repository_prefix
            with _step(version, StepName.WRITE_REPOSITORY) as say:
                store.delete_prefix(prefix + "/")
                model_key = f"{prefix}/{model_name}/{version.number}/model.onnx"
                store.copy(version.source_key, model_key)
                store.put_bytes(f"{prefix}/{model_name}/config.pbtxt", pbtxt.encode())
                say(f"wrote {prefix}/{model_name}/config.pbtxt and {model_key}")

            with _step(version, StepName.VERIFY) as say:
                verify_build(
                    version=version,
                    store=store,
                    prefix=prefix,
                    config=config,
                    signature=signature,
                    options=options,
                    say=say,
                    scratch=_scratch_server,
                )
    except Unavailable:
        raise
    except InvalidInput as exc:
        _skip_remaining(version.pk)
        registry.record_build_result(
            version_id=version.pk, attempt=attempt, succeeded=False, error=exc.detail, error_field=exc.field or ""
        )
        log.info("build.failed", extra={"version_id": version.pk, "error": exc.detail})
        return "failed"
    except Exception as exc:
        _skip_remaining(version.pk)
        registry.record_build_result(
            version_id=version.pk,
            attempt=attempt,
            succeeded=False,
            error=f"Internal error during the build ({type(exc).__name__}: {exc}). Retry with rebuild; "
            "if it persists, report it.",
        )
        raise
    registry.record_build_result(version_id=version.pk, attempt=attempt, succeeded=True)
    log.info("build.succeeded", extra={"version_id": version.pk})
    return "built"


def fail_build_after_retries(*, version_id: int, attempt: int, detail: str) -> None:
    """Mark a build failed once its transient errors outlived the task's retries."""
    _skip_remaining(version_id)
    registry.record_build_result(
        version_id=version_id,
        attempt=attempt,
        succeeded=False,
        error=f"{detail} The build gave up after retrying; start it again with rebuild.",
    )
