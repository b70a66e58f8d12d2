"""Build outputs in the team's storage quota: each build attempt's repository is reserved before it is written
and counted until it is deleted (`tenancy.quotas` field `storage_bytes`, beside the registry's uploads). A failed
attempt's repository is deleted as soon as it fails (`discard_attempt_repositories`): it serves nothing, and the
version keeps its uploaded file, so a rebuild writes a new attempt's repository from it."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Sum

from builds.models import BuildRepository
from models_registry.storage import get_object_store
from tenancy.quotas import register_usage_counter, reserve_quota

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from models_registry.models import ModelVersion


def reserve_repository_storage(*, version: ModelVersion, attempt: int, prefix: str, size_bytes: int) -> None:
    """Reserve `size_bytes` of the team's storage for the repository build `attempt` is about to write at `prefix`.

    Call it before writing the objects. A redelivered attempt reserves again in place of its own earlier
    reservation (the same keys are overwritten). Raises QuotaExceeded (field `storage_bytes`) when it does not fit.
    """
    with transaction.atomic():
        earlier = BuildRepository.objects.filter(version=version, attempt=attempt).first()
        reserve_quota(
            team=version.model.team,
            requested={"storage_bytes": size_bytes},
            released={"storage_bytes": earlier.size_bytes if earlier else 0},
            what="this build's repository",
        )
        BuildRepository.objects.update_or_create(
            version=version, attempt=attempt, defaults={"prefix": prefix, "size_bytes": size_bytes}
        )


def record_repository_size(*, version_id: int, attempt: int, size_bytes: int) -> None:
    """Count `size_bytes` for the repository build `attempt` wrote, once its objects changed after the reservation
    (verify rewrote config.pbtxt without batching): the count follows what is stored, without a quota check, since
    the bytes are already written (a few bytes of configuration either way)."""
    BuildRepository.objects.filter(version_id=version_id, attempt=attempt).update(size_bytes=size_bytes)


def forget_repository(*, version_id: int, prefix: str) -> None:
    """Stop counting the repository at `prefix` once its objects are deleted."""
    BuildRepository.objects.filter(version_id=version_id, prefix=prefix.strip("/")).delete()


def discard_attempt_repositories(*, version_id: int, attempts: Iterable[int]) -> int:
    """Delete the repositories that build `attempts` of a version wrote, and stop counting them in storage.

    Call it for attempts that failed (or were lost with their worker): none of them is the attempt whose repository
    the version serves, since that one succeeded, so no deployment reads them. The version's uploaded file is not
    touched. Objects go first, then the row, so an interruption leaves the row counted until the next call or
    `collect_repository_garbage`. Returns how many repositories were deleted. Raises Unavailable when the object
    store fails; what was deleted stays deleted.
    """
    rows = BuildRepository.objects.filter(version_id=version_id, attempt__in=list(attempts)).order_by("attempt")
    deleted = 0
    for row in rows:
        get_object_store().delete_prefix(row.prefix.strip("/") + "/")
        row.delete()
        deleted += 1
        log.info("build.repository.discarded", extra={"version_id": version_id, "attempt": row.attempt})
    return deleted


def count_teams_build_outputs(team_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """The `storage_bytes` quota's part of build outputs for each team, in one query: bytes of every build
    repository the team has stored ({team id: {"bytes of storage": n}})."""
    rows = (
        BuildRepository.objects.filter(version__model__team_id__in=team_ids)
        .order_by()
        .values("version__model__team_id")
        .annotate(total=Sum("size_bytes"))
        .values_list("version__model__team_id", "total")
    )
    return {team_id: {"bytes of storage": total or 0} for team_id, total in rows}


def count_team_build_outputs(team: Any) -> dict[str, int]:
    """The `storage_bytes` quota's part of build outputs: bytes of every build repository the team has stored."""
    return count_teams_build_outputs([team.pk]).get(team.pk, {"bytes of storage": 0})


def register_quota_counters() -> None:
    """Tell tenancy that build outputs count in storage (from AppConfig.ready)."""
    register_usage_counter("storage_bytes", count_team_build_outputs, for_teams=count_teams_build_outputs)
