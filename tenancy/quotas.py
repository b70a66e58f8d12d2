"""Team quotas: each team's limits, what it uses, and the check that reserves within them.

Limits are a team's `TeamQuota` row, where staff set one, else the CONCH_QUOTA_* settings. Usage is not stored:
it is counted, when asked, from the tables that own each resource, by counters the owning apps register
(`register_usage_counter`, from their AppConfig.ready; tenancy sits below them and imports none of them; several
apps may count parts of one field, e.g. storage: uploads in the registry, build outputs in builds). So
usage is never out of date, and a resource stops counting when its own row says it is gone (a deployment once
`stopped`, a model once deleted).

`reserve_quota` runs inside the caller's transaction, before the caller writes its row and before any side
effect: it locks the team's row (SELECT … FOR UPDATE), counts, and raises QuotaExceeded when the request does not
fit. Every reservation of a team takes the same lock, so two concurrent requests are counted one after the other
and the second sees the first's committed row (PostgreSQL's READ COMMITTED takes a new snapshot per statement,
after the lock is granted).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from conch.errors import InvalidInput, NotFound, QuotaExceeded
from tenancy.models import Team, TeamQuota

#: Quota fields: (the TeamQuota column, the default setting, what the unit is called in messages, the name of
#: the quota in messages). The GPU quota's unit is the Kubernetes resource name counted.
FIELDS: dict[str, tuple[str, str, str, str]] = {
    "gpu": ("gpus", "CONCH_QUOTA_GPUS", "nvidia.com/gpu", "GPU"),
    "instances": ("instances", "CONCH_QUOTA_INSTANCES", "model instances", "Model instance"),
    "storage_bytes": ("storage_bytes", "CONCH_QUOTA_STORAGE_BYTES", "bytes of storage", "Storage"),
    "models": ("registered_models", "CONCH_QUOTA_MODELS", "models", "Model"),
    "deployments": ("deployments", "CONCH_QUOTA_DEPLOYMENTS", "deployments", "Deployment"),
}

#: A counter returns a team's usage of one quota field: {unit: amount}. One unit for every field but `gpu`,
#: which counts `nvidia.com/gpu` and each `nvidia.com/mig-<profile>` apart, each against the same limit.
UsageCounter = Callable[[Team], Mapping[str, int]]

_counters: dict[str, list[UsageCounter]] = {}


@dataclass(frozen=True)
class Usage:
    """One line of a team's usage: quota `field`, the `unit` counted, the `limit` and what is `used`."""

    field: str
    unit: str
    limit: int
    used: int
    is_default: bool


@dataclass(frozen=True)
class QuotaRoom:
    """What `team` uses of one quota `field` (one unit) now and its limit: a check without a reservation."""

    team_slug: str
    field: str
    unit: str
    limit: int
    used: int

    @property
    def free(self) -> int:
        """Units left before the limit (0 when at or over it)."""
        return max(0, self.limit - self.used)

    def exceeded(self, requested: int, what: str) -> QuotaExceeded:
        """The refusal of `requested` units for `what` ("this upload needs at least")."""
        name = FIELDS[self.field][3]
        return QuotaExceeded(
            f"{name} quota exceeded: team '{self.team_slug}' uses {self.used} of {self.limit} {self.unit}; "
            f"{what} {requested}",
            field=self.field,
            limit=self.limit,
            used=self.used,
            requested=requested,
        )

    def check(self, requested: int, what: str = "this request needs") -> None:
        """Raise QuotaExceeded when `requested` more units do not fit."""
        if requested > 0 and self.used + requested > self.limit:
            raise self.exceeded(requested, what)


def register_usage_counter(field: str, counter: UsageCounter) -> None:
    """Count `counter`'s usage in `field` (the app owning the resource calls this at start); a field's usage is
    the sum of its counters. Registering the same counter twice counts it once."""
    if field not in FIELDS:
        raise ValueError(f"unknown quota field {field!r}")
    counters = _counters.setdefault(field, [])
    if counter not in counters:
        counters.append(counter)


def quota_room(*, team: Team, field: str) -> QuotaRoom:
    """`team`'s limit and use of `field` (a field counted in one unit: not `gpu`), counted now, without a lock.

    For early refusals (an upload whose declared size cannot fit) before the reservation proper
    (`reserve_quota`), which counts again under the team's lock.
    """
    unit = FIELDS[field][2]
    return QuotaRoom(
        team_slug=team.slug,
        field=field,
        unit=unit,
        limit=quota_limits(team=team)[field][0],
        used=_count(team, field).get(unit, 0),
    )


def quota_limits(*, team: Team) -> dict[str, tuple[int, bool]]:
    """Each quota field's limit for `team` and whether it is the default: {field: (limit, is_default)}."""
    row = TeamQuota.objects.filter(team=team).first()
    limits = {}
    for field, (column, setting, _, _) in FIELDS.items():
        own = getattr(row, column) if row is not None else None
        limits[field] = (own, False) if own is not None else (int(getattr(settings, setting)), True)
    return limits


def team_usage(*, team: Team) -> list[Usage]:
    """What `team` uses of each quota, counted now: one line per field and unit (GPU: one per resource name,
    `nvidia.com/gpu` always listed)."""
    limits = quota_limits(team=team)
    lines = []
    for field, (_, _, unit, _) in FIELDS.items():
        limit, is_default = limits[field]
        used = dict(_count(team, field))
        used.setdefault(unit, 0)
        for name in sorted(used, key=lambda name: (name != unit, name)):
            lines.append(Usage(field=field, unit=name, limit=limit, used=used[name], is_default=is_default))
    return lines


def reserve_quota(
    *,
    team: Team,
    requested: Mapping[str, int | Mapping[str, int]],
    released: Mapping[str, int | Mapping[str, int]] | None = None,
    what: str = "this request",
) -> None:
    """Lock `team`'s row and check that `requested` fits beside what the team uses now; call it inside the
    transaction that then writes the resource's row, before any side effect.

    `requested` maps quota fields to amounts (an int, or {unit: int} for `gpu`). `released` is what the change
    gives back at the same time (a deployment scaled from 2 to 4 replicas requests 4 and releases its 2): a
    unit whose request is no larger than its release is not checked, so scaling down is always allowed. `what`
    names the request in the message ("this deployment"). Raises QuotaExceeded (409) naming the field, with the
    limit, the use (less what is released) and the request.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("reserve_quota must run inside the transaction that reserves the resource")
    Team.objects.select_for_update().filter(pk=team.pk).values_list("pk", flat=True).first()
    limits = quota_limits(team=team)
    for field, amount in requested.items():
        asked = _by_unit(field, amount)
        given_back = _by_unit(field, (released or {}).get(field, 0))
        wanted = {unit: count for unit, count in asked.items() if count > given_back.get(unit, 0)}
        if not wanted:
            continue
        used_now = _count(team, field)
        limit = limits[field][0]
        for unit, count in sorted(wanted.items()):
            used = used_now.get(unit, 0) - given_back.get(unit, 0)
            room = QuotaRoom(team_slug=team.slug, field=field, unit=unit, limit=limit, used=used)
            room.check(count, f"{what} needs")


def get_team_for_staff(*, slug: str) -> Team:
    """The team `slug`, for staff (who set limits of any team). Raises NotFound (field `slug`)."""
    team = Team.objects.filter(slug=slug).first()
    if team is None:
        raise NotFound(f"Team '{slug}' does not exist.", field="slug")
    return team


def set_quota(*, team: Team, limits: Mapping[str, Any]) -> list[Usage]:
    """Set some of `team`'s limits: {field: whole number >= 0, or None for the default}; returns its usage.

    Fields are those of FIELDS. Raises InvalidInput naming the field. A limit below what the team uses now is
    allowed: nothing is stopped, new requests are refused until usage falls under it.
    """
    if not limits:
        raise InvalidInput(f"Send at least one of {', '.join(FIELDS)}.", field="request")
    columns = {}
    for field, value in limits.items():
        if field not in FIELDS:
            raise InvalidInput(f"{field} is not a quota; send any of {', '.join(FIELDS)}.", field=field)
        highest = 2**63 - 1 if field == "storage_bytes" else 2**31 - 1
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= highest):
            raise InvalidInput(
                f"{field} must be a whole number from 0 to {highest}, or null for the default.", field=field
            )
        columns[FIELDS[field][0]] = value
    TeamQuota.objects.update_or_create(team=team, defaults=columns)
    return team_usage(team=team)


def _by_unit(field: str, amount: int | Mapping[str, int]) -> dict[str, int]:
    if isinstance(amount, Mapping):
        return {unit: count for unit, count in amount.items() if count}
    return {FIELDS[field][2]: amount} if amount else {}


def _count(team: Team, field: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for counter in _counters.get(field, ()):
        for unit, count in counter(team).items():
            total[unit] = total.get(unit, 0) + count
    return {unit: count for unit, count in total.items() if count}
