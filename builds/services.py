"""The build pipeline: inspect -> configure -> write repository -> verify.

`run_build` turns a version's uploaded ONNX file into a Triton model repository in the
object store and proves it serves. Each step has a `BuildStep` row with its status and
log lines. A build is idempotent: it is keyed by (version, attempt), writes only under
its attempt's own repository prefix (an earlier attempt's repository, which a deployment
may serve, is never deleted or changed), and a redelivered task simply does the same work again.

No build stays stuck: a running build writes a heartbeat (at each step and from a small thread
in between), and `sweep_stalled_versions` (a periodic task) starts the next attempt of a build
whose heartbeat stopped (its worker died), of a queued build no worker claimed (its message was
lost), and aborts uploads whose bytes stopped arriving. `collect_repository_garbage` deletes the
repositories of attempts nothing uses any more.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import current_app
from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from builds.choices import STEP_ORDER, StepName, StepStatus
from builds.model_config import build_model_config, parse_build_options
from builds.models import BuildStep
from builds.sandbox import inspect_onnx_in_sandbox
from builds.verification import describe_sample_arrays, parse_sample_values, read_sample_arrays
from builds.verify_step import axis_names_text, describe_batching_plan, verify_build
from conch.errors import ConchError, InvalidInput, Unavailable
from models_registry import services as registry
from models_registry.choices import VersionStatus
from models_registry.storage import ObjectStore, StoredObject, get_object_store
from tritonserving import server as triton_server
from tritonserving import smoke
from tritonserving.config import config_to_pbtxt
from tritonserving.smoke import ScratchServer, VerifyServer

if TYPE_CHECKING:
    from models_registry.models import ModelVersion

log = logging.getLogger(__name__)

#: Server ids of verify servers are "<CONCH_INSTANCE_ID>.verify.<owner pid>-<hex>", the owner being the worker
#: process that runs the build. Instance ids may not contain ".", so one installation's prefix never matches
#: another's.
SERVER_ID_INFIX_VERIFY = ".verify."

_ATTEMPT_SEGMENT = re.compile(r"attempt-[0-9]+")


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
                    if not registry.record_build_heartbeat(version_id=self.version_id, attempt=self.attempt):
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
    if not registry.record_build_heartbeat(version_id=version.pk, attempt=version.build_attempt):
        raise BuildSuperseded()
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
    empty `sample_values` text removes the values); None keeps it. A build that stalled may be rebuilt:
    `building` with no heartbeat for CONCH_BUILD_STALE_SECONDS (its worker stopped), or `queued` for
    CONCH_BUILD_QUEUED_STALE_SECONDS with no worker claiming it. Raises InvalidInput (field `sample_inputs` or
    `sample_values`) for bad samples, Conflict while the upload is unfinished or a build is queued or running
    normally; the version's samples are unchanged then.
    """
    store = get_object_store()
    build_options = dict(version.build_options or {})
    previous = build_options.get("samples") or {}
    samples = _accept_samples(store, version, previous, sample_inputs, sample_values, move=False)
    build_options.pop("samples", None)
    if samples:
        build_options["samples"] = samples
    with transaction.atomic():
        version = registry.mark_rebuild(
            version=version,
            building_stale_before=_building_stale_before(),
            queued_stale_before=_queued_stale_before(),
            build_options=build_options,
        )
        if sample_inputs is not None:
            store.copy(sample_inputs.key, samples["key"])
        queue_build(version_id=version.pk, attempt=version.build_attempt)
    if sample_inputs is not None:
        store.delete(sample_inputs.key)
    return version


def _building_stale_before() -> datetime:
    return timezone.now() - timedelta(seconds=settings.CONCH_BUILD_STALE_SECONDS)


def _queued_stale_before() -> datetime:
    return timezone.now() - timedelta(seconds=settings.CONCH_BUILD_QUEUED_STALE_SECONDS)


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


def _scratch_server() -> ScratchServer | VerifyServer:
    """The server the verify step runs on: this process's warm one (CONCH_VERIFY_WARM_SERVER), else a throwaway."""
    if settings.CONCH_VERIFY_WARM_SERVER:
        return smoke.get_verify_server(_verify_server_settings())
    return ScratchServer(
        work_dir=Path(settings.CONCH_TRITON_DIR),
        server_id=f"{settings.CONCH_INSTANCE_ID}{SERVER_ID_INFIX_VERIFY}{os.getpid()}-{uuid.uuid4().hex[:12]}",
        bind_address=settings.CONCH_TRITON_BIND_ADDRESS,
        start_timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS,
    )


def _verify_server_settings() -> smoke.VerifyServerSettings:
    # The server appends "<owner pid>-<hex>": stop_verify_servers relies on that form.
    return smoke.VerifyServerSettings(
        work_dir=Path(settings.CONCH_TRITON_DIR),
        server_id_prefix=f"{settings.CONCH_INSTANCE_ID}{SERVER_ID_INFIX_VERIFY}",
        bind_address=settings.CONCH_TRITON_BIND_ADDRESS,
        start_timeout_s=settings.CONCH_TRITON_START_TIMEOUT_SECONDS,
    )


def warm_up_verify_server() -> None:
    """Start this worker process's warm verify server in a background thread, so its first build finds it ready
    (run on Celery's `worker_process_init`). Does nothing when CONCH_VERIFY_WARM_SERVER is off."""
    if settings.CONCH_VERIFY_WARM_SERVER:
        smoke.warm_up_verify_server(_verify_server_settings())


def stop_warm_verify_server() -> None:
    """Stop this process's warm verify server, if it has one (run on Celery's `worker_process_shutdown`)."""
    smoke.stop_verify_server()


def stop_verify_servers(*, only_abandoned: bool = True) -> int:
    """Stop this installation's verify servers on this host whose build worker process is gone (all of them
    when `only_abandoned` is False, at shutdown); returns how many. Run by the periodic reconcile, so a verify
    server whose build died is stopped within one reconcile interval."""
    stopped = 0
    prefix = f"{settings.CONCH_INSTANCE_ID}{SERVER_ID_INFIX_VERIFY}"
    for found in triton_server.find_servers(prefix):
        owner = found.server_id[len(prefix) :].split("-", 1)[0]
        if only_abandoned and owner.isdigit() and triton_server.process_exists(int(owner)):
            continue
        triton_server.stop_server(found.pid, found.create_time)
        stopped += 1
        log.warning("build.verify_server_stopped", extra={"server_id": found.server_id})
    return stopped


def run_build(*, version_id: int, attempt: int) -> str:
    """Run build `attempt` of a version; returns the version's final status (or "skipped").

    Permanent problems (a bad file, a meaningless option, a model that fails its smoke
    inference) mark the version `failed` with a message naming the field or tensor.
    `Unavailable` (object store or Triton unreachable) puts the version back to `queued` and
    propagates so the task retries. "skipped": the attempt is stale, finished, being built by
    a live worker, or was superseded while it ran. The repository goes under the attempt's own
    prefix (`registry.repository_prefix`), recorded as the version's on success.
    """
    version = registry.claim_build(version_id=version_id, attempt=attempt, stale_before=_building_stale_before())
    if version is None:
        return "skipped"
    with BuildHeartbeat(version_id=version_id, attempt=attempt, interval_s=settings.CONCH_BUILD_HEARTBEAT_SECONDS):
        return _run_claimed_build(version, attempt)


def _run_claimed_build(version: ModelVersion, attempt: int) -> str:
    reset_steps(version=version)
    store = get_object_store()
    model_name = version.model.name
    try:
        with tempfile.TemporaryDirectory(prefix="conch-build-") as tmp:
            local = Path(tmp) / "model.onnx"
            with _step(version, StepName.INSPECT) as say:
                say(f"downloading {version.source_key} ({version.source_size_bytes} bytes)")
                store.download_to(version.source_key, local)
                signature = inspect_onnx_in_sandbox(local)
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

            prefix = registry.repository_prefix(model_id=version.model_id, number=version.number, attempt=attempt)
            with _step(version, StepName.WRITE_REPOSITORY) as say:
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
    except BuildSuperseded:
        log.info("build.superseded", extra={"version_id": version.pk, "attempt": attempt})
        return "skipped"
    except Unavailable:
        registry.release_build(version_id=version.pk, attempt=attempt)
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
    registry.record_build_result(version_id=version.pk, attempt=attempt, succeeded=True, repository_prefix=prefix)
    log.info("build.succeeded", extra={"version_id": version.pk, "attempt": attempt, "prefix": prefix})
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


def sweep_stalled_versions() -> dict[str, int]:
    """Recover versions stuck in `building`, `queued` or `uploading`; return what was done, by kind.

    Run periodically (task `builds.sweep_stalled_versions`); it is what makes recovery true on every
    broker, kombu's filesystem transport included (it deletes a message when a worker reads it, so a
    late ack protects nothing):

    - `building` with no heartbeat for CONCH_BUILD_STALE_SECONDS: the worker stopped mid-build. The next
      attempt is queued, until CONCH_BUILD_MAX_ATTEMPTS attempts were lost that way; then the version
      fails with a message saying so and that rebuild retries. (`requeued`, `failed`)
    - `queued` for CONCH_BUILD_QUEUED_STALE_SECONDS with no worker claiming it: the message was lost, or
      waits in a deep queue. The same attempt is sent again (a duplicate is skipped by whichever copy comes
      second); this does not count as a lost attempt. (`requeued_unclaimed`)
    - `uploading` with no bytes for CONCH_UPLOAD_STALE_SECONDS: the row, the stored object and any open
      multipart upload are removed. (`aborted_uploads`)
    """
    counts = {"requeued": 0, "failed": 0, "requeued_unclaimed": 0, "aborted_uploads": 0}
    building_before = _building_stale_before()
    max_attempts = settings.CONCH_BUILD_MAX_ATTEMPTS
    stale_s = settings.CONCH_BUILD_STALE_SECONDS
    for version_id in registry.stalled_version_ids(status=VersionStatus.BUILDING, stale_before=building_before):
        step = BuildStep.objects.filter(version_id=version_id, status=StepStatus.RUNNING).order_by("position").first()
        where = f" at step '{step.name}'" if step else ""
        error = (
            f"The worker stopped during the build{where} (no heartbeat for {stale_s:.0f} s), "
            f"{max_attempts} times in a row: the worker was killed or restarted, or the model exhausts it (memory). "
            "Start the build again with rebuild."
        )
        with transaction.atomic():
            version = registry.recover_stalled_build(
                version_id=version_id, stale_before=building_before, max_attempts=max_attempts, error=error
            )
            if version is None:
                continue
            if version.status == VersionStatus.FAILED:
                _close_lost_steps(version_id, "the worker stopped during this step; the build gave up")
                counts["failed"] += 1
                log.warning("build.worker_lost.failed", extra={"version_id": version_id})
                continue
            _close_lost_steps(
                version_id,
                f"the worker stopped during this step; queued again as attempt {version.build_attempt} "
                f"({version.lost_attempts} of {max_attempts} lost)",
            )
            queue_build(version_id=version_id, attempt=version.build_attempt)
        counts["requeued"] += 1
        log.warning(
            "build.worker_lost.requeued",
            extra={"version_id": version_id, "attempt": version.build_attempt, "lost_attempts": version.lost_attempts},
        )
    queued_before = _queued_stale_before()
    for version_id in registry.stalled_version_ids(status=VersionStatus.QUEUED, stale_before=queued_before):
        with transaction.atomic():
            version = registry.requeue_unclaimed_build(version_id=version_id, queued_before=queued_before)
            if version is None:
                continue
            queue_build(version_id=version_id, attempt=version.build_attempt)
        counts["requeued_unclaimed"] += 1
        log.warning("build.unclaimed.requeued", extra={"version_id": version_id, "attempt": version.build_attempt})
    counts["aborted_uploads"] = registry.abort_stale_uploads(
        stale_before=timezone.now() - timedelta(seconds=settings.CONCH_UPLOAD_STALE_SECONDS)
    )
    return counts


def _close_lost_steps(version_id: int, line: str) -> None:
    """Mark the step a dead worker was running as failed (with `line` in its log) and skip the rest."""
    stamp = timezone.now().strftime("%H:%M:%S")
    for step in BuildStep.objects.filter(version_id=version_id, status=StepStatus.RUNNING):
        step.log.append(f"{stamp} {line}")
        _finish(step, StepStatus.FAILED)
    _skip_remaining(version_id)


def collect_repository_garbage(*, keep: Iterable[str], grace_seconds: float | None = None) -> int:
    """Delete build repositories nothing uses; return how many attempt prefixes were deleted.

    A version's attempt prefix (`.../repository/attempt-<k>`) is deleted unless it is the version's current
    `repository_prefix`, the attempt now queued or building, or in `keep` (the prefixes deployments pin; the
    deployments app passes them), or lies inside or around one of those. Only versions whose last status change
    is older than `grace_seconds` (default CONCH_REPOSITORY_GC_GRACE_SECONDS) are touched, so a deployment that
    read the previous `repository_prefix` just before a rebuild finished can still pin it. Object-store errors
    propagate (Unavailable); what was deleted before stays deleted.
    """
    grace = settings.CONCH_REPOSITORY_GC_GRACE_SECONDS if grace_seconds is None else grace_seconds
    settled_before = timezone.now() - timedelta(seconds=grace)
    kept = {prefix.strip("/") for prefix in keep if prefix}
    store = get_object_store()
    deleted = 0
    for version in registry.versions_with_builds():
        if version.heartbeat_at is not None and version.heartbeat_at > settled_before:
            continue
        protected = set(kept)
        if version.repository_prefix:
            protected.add(version.repository_prefix.strip("/"))
        if version.status in (VersionStatus.QUEUED, VersionStatus.BUILDING):
            building = registry.repository_prefix(
                model_id=version.model_id, number=version.number, attempt=version.build_attempt
            )
            protected.add(building)
        root = registry.repositories_root(model_id=version.model_id, number=version.number)
        attempts = {
            key[len(root) + 1 :].split("/", 1)[0] for key in store.list_keys(root + "/") if key.startswith(root + "/")
        }
        for segment in sorted(attempts):
            prefix = f"{root}/{segment}"
            if not _ATTEMPT_SEGMENT.fullmatch(segment) or any(_overlaps(prefix, other) for other in protected):
                continue
            store.delete_prefix(prefix + "/")
            deleted += 1
            log.info("build.repository.collected", extra={"version_id": version.pk, "prefix": prefix})
    return deleted


def _overlaps(prefix: str, other: str) -> bool:
    """Whether folder `prefix` is `other`, inside it, or holds it."""
    return prefix == other or other.startswith(prefix + "/") or prefix.startswith(other + "/")
