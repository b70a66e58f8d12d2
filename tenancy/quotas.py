"""Team quotas: each team's limits, what it uses, and the check that reserves within them.

Limits are a team's `TeamQuota` row, where staff set one, else the CONCH_QUOTA_* settings. Usage is not stored:
it is counted, when asked, from the tables that own each resource, by counters the owning apps register
(`register_usage_counter`, from their AppConfig.ready; tenancy sits below them and imports none of them; several
apps may count parts of one field, e.g. storage: uploads and their sample inputs in the registry, build outputs
in builds, each deployment's own repository in deployments). So
usage is never out of date, and a resource stops counting when its own row says it is gone (a deployment once
`stopped`, a model once deleted).

`reserve_quota` runs inside the caller's transaction, before the caller writes its row and before any side
effect: it locks the team's row (SELECT … FOR UPDATE), counts, and raises QuotaExceeded when the request does not
fit. Every reservation of a team takes the same lock, so two concurrent requests are counted one after the other
and the second sees the first's committed row (PostgreSQL's READ COMMITTED takes a new snapshot per statement,
after the lock is granted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from conch.errors import InvalidInput, NotFound, QuotaExceeded
from tenancy.audit import record_audit
from tenancy.choices import AuditAction
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
#: The same count for many teams at once, in one query: {team id: {unit: amount}} for the team ids given (a team
#: using nothing may be left out). Lets a page of 100 teams be counted in one query per field.
TeamsUsageCounter = Callable[[Sequence[int]], Mapping[int, Mapping[str, int]]]

#: Per field, its counters (a field's usage is their sum), each with its many-teams form when it has one.
_counters: dict[str, list[tuple[UsageCounter, TeamsUsageCounter | None]]] = {}


@dataclass(frozen=True)
class Usage:
    """One line of a team's usage: quota `field`, the `unit` counted, the `limit` and what is `used`."""

    field: str
    unit: str
    limit: int
    used: int
    is_default: bool

    @property
    def share(self) -> float:
        """`used` as a fraction of `limit` (1.0: full; above 1: over, after a limit was lowered). A limit of 0
        (the resource is not allowed) with nothing used is 0.0, so teams kept off GPUs are not all "near" their
        limit; with something used, it is infinitely over."""
        if self.limit == 0:
            return 0.0 if self.used == 0 else float("inf")
        return self.used / self.limit


#: Share of a limit from which a team is "near" it (the admin's filter and bars).
NEAR_LIMIT_SHARE = 0.8


def register_usage_counter(field: str, counter: UsageCounter, *, for_teams: TeamsUsageCounter | None = None) -> None:
    """Count `counter`'s usage in `field` (the app owning the resource calls this at start); a field's usage is
    the sum of its counters, and registering the same counter twice counts it once. `for_teams` counts the same
    for many teams in one query (`teams_usage`), where the app offers it."""
    if field not in FIELDS:
        raise ValueError(f"unknown quota field {field!r}")
    entries = _counters.setdefault(field, [])
    if all(existing is not counter for existing, _ in entries):
        entries.append((counter, for_teams))


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
    return _limits_of(TeamQuota.objects.filter(team=team).first())


def _limits_of(row: TeamQuota | None) -> dict[str, tuple[int, bool]]:
    limits = {}
    for field, (column, setting, _, _) in FIELDS.items():
        own = getattr(row, column) if row is not None else None
        limits[field] = (own, False) if own is not None else (int(getattr(settings, setting)), True)
    return limits


def team_usage(*, team: Team) -> list[Usage]:
    """What `team` uses of each quota, counted now: one line per field and unit (GPU: one per resource name,
    `nvidia.com/gpu` always listed)."""
    return teams_usage(teams=[team])[team.pk]


def teams_usage(*, teams: Iterable[Team]) -> dict[int, list[Usage]]:
    """`team_usage` of each of `teams`, by team id, in a bounded number of queries: one for the limits and one
    per quota field (where the owning app registered a `for_teams` counter; else one per team for that field)."""
    teams = list(teams)
    ids = [team.pk for team in teams]
    rows = {row.team_id: row for row in TeamQuota.objects.filter(team_id__in=ids)} if ids else {}
    counted = {field: _count_teams(teams, field) for field in FIELDS}
    usage = {}
    for team in teams:
        limits = _limits_of(rows.get(team.pk))
        lines = []
        for field, (_, _, unit, _) in FIELDS.items():
            limit, is_default = limits[field]
            used = {name: amount for name, amount in counted[field].get(team.pk, {}).items() if amount}
            used.setdefault(unit, 0)
            for name in sorted(used, key=lambda name: (name != unit, name)):
                lines.append(Usage(field=field, unit=name, limit=limit, used=used[name], is_default=is_default))
        usage[team.pk] = lines
    return usage


def fullest_share(lines: Iterable[Usage]) -> float:
    """The largest `Usage.share` among a team's usage lines: how close the team is to its nearest limit."""
    return max((line.share for line in lines), default=0.0)


def team_ids_by_share(*, teams: Iterable[Team], at_least: float, over: bool = False) -> list[int]:
    """Ids of `teams` using at least `at_least` of some limit (`NEAR_LIMIT_SHARE`: near a limit), or, with
    `over`, more than some limit (a limit lowered below what the team already uses). A limit of 0 with nothing
    used counts as full (at 1.0), not over."""
    found = []
    for team_id, lines in teams_usage(teams=teams).items():
        share = fullest_share(lines)
        if (share > 1.0) if over else (share >= at_least):
            found.append(team_id)
    return found


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
    refusals = quota_refusals(team=team, requested=requested, released=released, what=what)
    if refusals:
        raise refusals[0]


def quota_refusals(
    *,
    team: Team,
    requested: Mapping[str, int | Mapping[str, int]],
    released: Mapping[str, int | Mapping[str, int]] | None = None,
    what: str = "this request",
) -> list[QuotaExceeded]:
    """Every refusal `reserve_quota` could give for `requested`, in its order (fields as given, units sorted):
    one QuotaExceeded per field and unit that has no room, [] when all fit. Same lock and counts as
    `reserve_quota` (call it inside a transaction); it raises nothing itself, so a check can show every field
    that does not fit at once (the deploy form's check)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("reserve_quota must run inside the transaction that reserves the resource")
    Team.objects.select_for_update().filter(pk=team.pk).values_list("pk", flat=True).first()
    limits = quota_limits(team=team)
    refusals = []
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
            if count > 0 and room.used + count > room.limit:
                refusals.append(room.exceeded(count, f"{what} needs"))
    return refusals


def get_team_for_staff(*, slug: str) -> Team:
    """The team `slug`, for staff (who set limits of any team). Raises NotFound (field `slug`)."""
    team = Team.objects.filter(slug=slug).first()
    if team is None:
        raise NotFound(f"Team '{slug}' does not exist.", field="slug")
    return team


def set_quota(*, team: Team, limits: Mapping[str, Any]) -> list[Usage]:
    """Set some of `team`'s limits: {field: whole number >= 0, or None for the default}; returns its usage.

    Fields are those of FIELDS. Raises InvalidInput naming the field. A limit below what the team uses now is
    allowed: nothing is stopped, new requests are refused until usage falls under it. Audited (`quota.changed`,
    the fields' limits before and after; null: the default).
    """
    if not limits:
        raise InvalidInput(f"Send at least one of {', '.join(FIELDS)}.", field="request")
    columns = {}
    for field, value in limits.items():
        check_limit(field=field, value=value)
        columns[FIELDS[field][0]] = value
    with transaction.atomic():
        row = TeamQuota.objects.select_for_update().filter(team=team).first()
        before = {field: getattr(row, FIELDS[field][0]) if row else None for field in limits}
        TeamQuota.objects.update_or_create(team=team, defaults=columns)
        record_audit(
            action=AuditAction.QUOTA_CHANGED,
            team=team,
            object_type="quota",
            object_id=team.pk,
            object_repr=f"quota of {team.slug}",
            before=before,
            after=dict(limits),
        )
    return team_usage(team=team)


def check_limit(*, field: str, value: Any) -> None:
    """Check one limit as `set_quota` takes it: `field` one of FIELDS, `value` a whole number from 0 to the
    column's largest (2**31 - 1; storage bytes 2**63 - 1), or None for the default. Raises InvalidInput naming
    the field and what to send."""
    if field not in FIELDS:
        raise InvalidInput(f"{field} is not a quota; send any of {', '.join(FIELDS)}.", field=field)
    highest = 2**63 - 1 if field == "storage_bytes" else 2**31 - 1
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= highest):
        raise InvalidInput(f"{field} must be a whole number from 0 to {highest}, or null for the default.", field=field)


def _by_unit(field: str, amount: int | Mapping[str, int]) -> dict[str, int]:
    if isinstance(amount, Mapping):
        return {unit: count for unit, count in amount.items() if count}
    return {FIELDS[field][2]: amount} if amount else {}


def _count_teams(teams: list[Team], field: str) -> dict[int, Mapping[str, int]]:
    if not teams:
        return {}
    totals: dict[int, dict[str, int]] = {team.pk: {} for team in teams}
    for counter, many in _counters.get(field, ()):
        counted = dict(many([team.pk for team in teams])) if many is not None else {t.pk: counter(t) for t in teams}
        for team_id, units in counted.items():
            if team_id in totals:
                for unit, count in units.items():
                    totals[team_id][unit] = totals[team_id].get(unit, 0) + count
    return {team_id: {unit: n for unit, n in units.items() if n} for team_id, units in totals.items()}


def _count(team: Team, field: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for counter, _ in _counters.get(field, ()):
        for unit, count in counter(team).items():
            total[unit] = total.get(unit, 0) + count
    return {unit: count for unit, count in total.items() if count}
