"""Submitting builds: record an upload or a rebuild (with its sample inputs) and queue the build."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from builds.model_config import (
    GRAPH_INPUTS_FIELD,
    GRAPH_OUTPUTS_FIELD,
    OUTPUT_DIMS_FIELD,
    TOLERANCE_FIELD,
    parse_build_options,
)
from builds.services import state
from builds.services.review import check_build_options
from builds.verification import check_sample_archive, parse_sample_values
from builds.verify_step import sample_limits
from conch.errors import InvalidInput, refuse_each
from models_registry import services as registry
from models_registry.storage import ObjectStore, StoredObject, get_object_store
from tenancy.choices import Role, Scope
from tenancy.services import TokenGrant, require_role

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from builds.models import Build
    from models_registry.models import ModelVersion

log = logging.getLogger(__name__)


def queue_build(*, version_id: int, attempt: int) -> None:
    """Queue build `attempt` of a version once the current transaction commits."""
    # By task name: tasks import this module, so importing them here would close a cycle.
    transaction.on_commit(lambda: current_app.signature("builds.build_version", args=(version_id, attempt)).delay())


def start_first_build(*, version: ModelVersion, options: Mapping[str, Any]) -> Build:
    """Start a freshly uploaded version's first build attempt (`queued`, `options` the validated build options) and
    queue it once the caller's transaction commits; returns the attempt."""
    build = state.open_first_build(version=version, options=dict(options))
    queue_build(version_id=version.pk, attempt=build.attempt)
    return build


def submit_upload(
    *,
    version: ModelVersion,
    stored: StoredObject,
    filename: str,
    options: Mapping[str, Any],
    sample_inputs: StoredObject | None = None,
    sample_values: Any = None,
    allow_duplicate: bool = False,
) -> ModelVersion:
    """Record a finished upload with its build options and sample inputs, and queue its first build.

    A file that already is a live version of the model is refused (Duplicate, 409 naming `sha256` and the
    version: `registry.complete_upload`) unless `allow_duplicate`; the caller then discards the upload.

    `options` are the raw form fields (max_batch_size, max_queue_delay_microseconds, preferred_batch_size,
    instance_count, output_dims: outputs' shapes in place of those the model file declares). `sample_inputs` is an
    `.npz` the view streamed to the version's incoming samples key
    (`registry.sample_inputs_key(incoming=True)`); `sample_values` the raw `sample_values` field ("sr=16000" or a
    JSON object). Verify uses them instead of generated inputs. Raises InvalidInput naming the option at fault,
    `sample_inputs`, `sample_values` or `file` (empty file); nothing is queued then, and the caller discards the
    upload (`registry.discard_upload` also deletes the samples). Sample inputs past CONCH_MAX_SAMPLE_UNPACKED_BYTES
    or CONCH_MAX_SAMPLE_ARRAYS once unpacked raise PayloadTooLarge (413, field `sample_inputs`), found before
    anything is unpacked.
    """
    parsed = parse_build_options(options)
    build_options = parsed.to_dict()
    store = get_object_store()
    samples = _accept_samples(store, version, {}, sample_inputs, sample_values, move=True)
    if samples:
        build_options["samples"] = samples
    with transaction.atomic():
        version = registry.complete_upload(
            version=version,
            stored=stored,
            filename=filename,
            build_options=build_options,
            allow_duplicate=allow_duplicate,
            samples_size_bytes=sample_inputs.size_bytes if sample_inputs is not None else 0,
        )
        start_first_build(version=version, options=build_options)
    return version


def request_rebuild(
    *,
    user: User,
    version: ModelVersion,
    sample_inputs: StoredObject | None = None,
    sample_values: Any = None,
    token: TokenGrant | None = None,
    options: Mapping[str, Any] | None = None,
) -> ModelVersion:
    """Build a version again from its stored file (after a fix in Conch, a transient failure, to add samples, or
    with other build options).

    `user` needs the developer role in the version's team and, with a `token`, the `models:write` scope
    (Forbidden otherwise; nothing changes then).

    `sample_inputs` / `sample_values` as for `submit_upload`: each one given replaces what the version had (an
    empty `sample_values` text removes the values); None keeps it. A build that stalled may be rebuilt:
    `building` with no heartbeat for CONCH_BUILD_STALE_SECONDS (its worker stopped), or `queued` for
    CONCH_BUILD_QUEUED_STALE_SECONDS with no worker claiming it. Raises InvalidInput (field `sample_inputs` or
    `sample_values`) for bad samples, Conflict while the upload is unfinished or a build is queued or running
    normally, QuotaExceeded (field `storage_bytes`) when new sample inputs do not fit in the team's storage in
    place of the old ones; the version's samples are unchanged then.

    `options` (the four build option fields, `output_dims`, `tolerance` and `dynamic_batching`; see
    `review.option_fields`), when given, replace the version's build options: a field left out or empty goes back
    to the model's default. They are checked first by the build's own rules against the version's signature
    (`review.check_build_options`): InvalidInput naming the first option at fault and carrying every one as
    `refusals` (the API lists them under `errors`), and nothing changes.
    """
    require_role(
        user=user,
        team=version.model.team,
        role=Role.DEVELOPER,
        action="Rebuilding a model version",
        token=token,
        scope=Scope.MODELS_WRITE,
    )
    store = get_object_store()
    current = state.current_build(version)
    build_options = dict(current.options if current is not None else {})
    if options is not None:
        check = check_build_options(version=version, fields=options)
        if not check.ok:
            raise refuse_each([InvalidInput(error["detail"], field=error["field"]) for error in check.errors])
        build_options.pop(OUTPUT_DIMS_FIELD, None)  # left out, the model file's shapes are used again
        build_options.pop(TOLERANCE_FIELD, None)  # left out, the datatypes' default tolerances apply again
        build_options.pop(GRAPH_INPUTS_FIELD, None)  # left out, a frozen graph's interface is discovered again
        build_options.pop(GRAPH_OUTPUTS_FIELD, None)
        if check.options is not None:  # set whenever check.ok
            build_options.update(check.options.to_dict())
    previous = build_options.get("samples") or {}
    samples = _accept_samples(store, version, previous, sample_inputs, sample_values, move=False)
    build_options.pop("samples", None)
    if samples:
        build_options["samples"] = samples
    with transaction.atomic():
        build = state.mark_rebuild(
            version=version,
            building_stale_before=building_stale_before(),
            queued_stale_before=queued_stale_before(),
            build_options=build_options,
            samples_size_bytes=sample_inputs.size_bytes if sample_inputs is not None else None,
        )
        if sample_inputs is not None:
            store.copy(sample_inputs.key, samples["key"])
        queue_build(version_id=version.pk, attempt=build.attempt)
    if sample_inputs is not None:
        store.delete(sample_inputs.key)
    return build.version


def building_stale_before() -> datetime:
    return timezone.now() - timedelta(seconds=settings.CONCH_BUILD_STALE_SECONDS)


def queued_stale_before() -> datetime:
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
        # Checked from the archive's directory and the arrays' headers only (PayloadTooLarge past the limits): this
        # process unpacks no array; the worker reads them, within the same limits, and checks their CRC-32.
        described = check_sample_archive(store.read_bytes(sample_inputs.key), limits=sample_limits())
        samples["key"] = registry.sample_inputs_key(model_id=version.model_id, number=version.number)
        samples["inputs"] = described
        if move:
            store.copy(sample_inputs.key, samples["key"])
            store.delete(sample_inputs.key)
    return samples
