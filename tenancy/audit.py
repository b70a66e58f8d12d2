"""The audit log: who changed what, in which team, from where, recorded by the service that made the change.

Every mutating service of every app calls `record_audit(...)` once its change is made (inside its transaction
where it has one, so a change that is rolled back leaves no entry). Who acted is not passed in: it is read from
the audit context of the running code, which the edges set:

- a web request (`tenancy.middleware.AuditContextMiddleware`): the request's user as authenticated (a console
  session, or an API token, whose prefix is kept too), the client's IP (`client_ip`), and source `api` (under
  /api/ and /serve/), `admin` (under the admin) or `console`;
- a management command built on `AuditedCommand`: actor "system", source `command` and the command's name;
- a Celery task (the task_prerun/task_postrun signals, connected in `connect_signals`): actor "system", source
  `task` and the task's name, also when beat scheduled it;
- anything else (a shell, a test calling a service directly): actor "system", source `system`.

Admin saves are recorded from Django's own admin log (a LogEntry saved for an add or a change) and deletions in
the admin from post_delete of the models each app names with `audit_admin_deletions` (so a bulk "delete
selected", whose LogEntries are written without signals, is recorded too, cascades included).

Entries are append-only: nothing here changes or deletes one, and the database refuses UPDATE and DELETE on the
table (a trigger, migration 0001).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from functools import lru_cache
from operator import attrgetter
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.core.management.base import BaseCommand
from django.db import models
from django.http import HttpRequest
from django.utils import timezone

from tenancy.choices import AuditAction, AuditSource
from tenancy.models import ApiToken, AuditEntry, Membership, Team, TeamQuota

#: The actor of an entry made without a signed-in user (a command, a task, beat).
SYSTEM_ACTOR = "system"
#: Longest text kept for one value of a before/after summary (characters).
MAX_SUMMARY_TEXT = 300
#: Friendlier object type names for the models whose name says less (`object_type` of an entry).
OBJECT_TYPES = {
    "registeredmodel": "model",
    "modelversion": "version",
    "apitoken": "token",
    "teamquota": "quota",
    "custombackend": "backend",
}


@dataclass(frozen=True)
class AuditContext:
    """Who is acting in the running code: a request (its user and token are read when an entry is made, after
    authentication), or a command or task (`detail`: its name)."""

    source: str
    detail: str = ""
    request: HttpRequest | None = None
    ip: str | None = None


_context: ContextVar[AuditContext | None] = ContextVar("conch_audit_context", default=None)


@contextmanager
def audit_context(
    *, source: AuditSource, detail: str = "", request: HttpRequest | None = None, ip: str | None = None
) -> Iterator[AuditContext]:
    """Make entries recorded inside the block come from `source` (and `request`'s user, token and `ip`)."""
    context = AuditContext(source=str(source), detail=detail[:200], request=request, ip=ip)
    token = _context.set(context)
    try:
        yield context
    finally:
        _context.reset(token)


def record_audit(
    *,
    action: AuditAction | str,
    team: Team | None,
    target: models.Model | None = None,
    object_type: str = "",
    object_id: object = "",
    object_repr: str = "",
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """Record that `action` was done to an object of `team` (None: no team, e.g. a cluster); returns the entry.

    Call it from the service that makes the change, right after the change (inside its transaction where it has
    one), e.g.::

        record_audit(action=AuditAction.MODEL_DELETED, team=model.team, target=model, before={"versions": 3})

    `target` gives the object's type (its model name; `OBJECT_TYPES` renames a few), id and text; or give
    `object_type`, `object_id` and `object_repr` (they also override `target`'s). `before`/`after` are a small
    summary of what changed (a few fields, not whole rows): JSON values, dates as ISO 8601 text, text cut at
    MAX_SUMMARY_TEXT characters. Who did it, the source and the IP come from the audit context (module
    docstring). Raises ValueError for an action not in `AuditAction` (add it there first).
    """
    if action not in AuditAction.values:
        raise ValueError(f"unknown audit action {action!r}; add it to tenancy.choices.AuditAction")
    if target is not None:
        object_type = object_type or _type_name(type(target))
        object_id = object_id if object_id != "" else target.pk
        object_repr = object_repr or str(target)
    context = _context.get()
    user, actor, token_prefix = _actor(context)
    return AuditEntry.objects.create(
        created_at=timezone.now(),
        team=team,
        team_slug=team.slug if team is not None else "",
        user=user,
        actor=actor[:150],
        token_prefix=token_prefix[:16],
        source=context.source if context is not None else AuditSource.SYSTEM,
        source_detail=context.detail if context is not None else "",
        ip=context.ip if context is not None else None,
        action=str(action),
        object_type=object_type[:40],
        object_id=str(object_id if object_id is not None else "")[:64],
        object_repr=object_repr[:200],
        before=_summary(before),
        after=_summary(after),
    )


def _actor(context: AuditContext | None) -> tuple[Any, str, str]:
    """(user or None, actor name, token prefix) of the context: the request's authenticated user, else system."""
    request = context.request if context is not None else None
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None, SYSTEM_ACTOR, ""
    # DRF sets `auth` on the Django request too: a TokenGrant for a bearer token, None for a session.
    grant = getattr(request, "auth", None)
    return user, user.get_username(), getattr(grant, "prefix", "") or ""


def _summary(values: Mapping[str, Any] | None) -> dict[str, Any]:
    return {str(key): _plain(value) for key, value in (values or {}).items()}


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Mapping):
        return _summary(value)
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(item) for item in value]
    if isinstance(value, Decimal):
        return str(value)
    text = str(value)
    return text if len(text) <= MAX_SUMMARY_TEXT else text[: MAX_SUMMARY_TEXT - 1] + "…"


def _type_name(model: type[models.Model]) -> str:
    name = model._meta.model_name or ""
    return OBJECT_TYPES.get(name, name)


# --- the client's address ------------------------------------------------------------


def client_ip(request: HttpRequest) -> str | None:
    """The IP address of the client that sent `request`, as text (None when the server gave none).

    REMOTE_ADDR, unless that is a proxy listed in CONCH_TRUSTED_PROXIES (addresses or networks): then the
    X-Forwarded-For header is read from its right end (each proxy appends the address it received from), skipping
    trusted proxies; the first address that is not one is the client. A hop that is not an IP address ends the
    walk at the last address trusted so far, so a client cannot pass off a forged header as its address.
    """
    remote = _address(request.META.get("REMOTE_ADDR", ""))
    if remote is None:
        return None
    trusted = _trusted_networks(tuple(settings.CONCH_TRUSTED_PROXIES))
    client = remote
    if _is_trusted(client, trusted):
        hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
        for hop in reversed(hops):
            address = _address(hop)
            if address is None:
                break
            client = address
            if not _is_trusted(address, trusted):
                break
    return str(client)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


@lru_cache(maxsize=8)
def _trusted_networks(entries: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def _is_trusted(address, networks) -> bool:
    return any(address.version == network.version and address in network for network in networks)


# --- edges: management commands, Celery tasks, the admin -----------------------------------


class AuditedCommand(BaseCommand):
    """A management command whose changes are recorded as actor "system", source `command` and its name.

    Base every command that changes something on this class instead of BaseCommand.
    """

    def execute(self, *args: Any, **options: Any) -> Any:
        name = type(self).__module__.rsplit(".", 1)[-1]
        with audit_context(source=AuditSource.COMMAND, detail=name):
            return super().execute(*args, **options)


_task_tokens: dict[str, Token] = {}


def _task_started(sender=None, task_id: str | None = None, task=None, **kwargs: Any) -> None:
    name = getattr(task, "name", None) or getattr(sender, "name", "") or ""
    _task_tokens[task_id or ""] = _context.set(AuditContext(source=AuditSource.TASK, detail=name))


def _task_finished(sender=None, task_id: str | None = None, **kwargs: Any) -> None:
    token = _task_tokens.pop(task_id or "", None)
    if token is None:
        return
    try:
        _context.reset(token)
    except ValueError:  # finished in another context than it started in: nothing of the task's stays
        _context.set(None)


def _team_of(obj: models.Model) -> Team | None:
    """The team an object belongs to: itself, its `team`, its model's or its version's model's."""
    if isinstance(obj, Team):
        return obj
    for path in ("team", "model.team", "version.model.team"):
        try:
            value = attrgetter(path)(obj)
        except (AttributeError, ObjectDoesNotExist):
            continue
        if isinstance(value, Team):
            return value
    return None


def _log_entry_saved(sender, instance, created: bool = False, raw: bool = False, **kwargs: Any) -> None:
    """An admin add or change (Django's LogEntry); deletions are recorded by `_deleted_in_admin`."""
    from django.contrib.admin.models import ADDITION, CHANGE

    if not created or raw or instance.action_flag not in (ADDITION, CHANGE):
        return
    model = instance.content_type.model_class() if instance.content_type_id else None
    obj = None
    if model is not None:
        obj = model._default_manager.filter(pk=instance.object_id).first()
    record_audit(
        action=AuditAction.ADMIN_ADDED if instance.action_flag == ADDITION else AuditAction.ADMIN_CHANGED,
        team=_team_of(obj) if obj is not None else None,
        object_type=_type_name(model) if model is not None else "",
        object_id=instance.object_id or "",
        object_repr=instance.object_repr,
        after={"change": instance.get_change_message()},
    )


def _deleted_in_admin(sender, instance, **kwargs: Any) -> None:
    context = _context.get()
    if context is None or context.source != AuditSource.ADMIN:
        return
    record_audit(action=AuditAction.ADMIN_DELETED, team=_team_of(instance), target=instance)


def audit_admin_deletions(*model_classes: type[models.Model]) -> None:
    """Record every deletion of these models made in the admin (each app names its own, from AppConfig.ready).

    Only models deleted a few at a time: a post_delete receiver makes Django load each deleted row.
    """
    from django.db.models.signals import post_delete

    for model in model_classes:
        post_delete.connect(_deleted_in_admin, sender=model, dispatch_uid=f"audit-admin-delete-{model._meta.label}")


def connect_signals() -> None:
    """Connect the task and admin-log receivers (tenancy's AppConfig.ready)."""
    from celery import signals as celery_signals
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth import get_user_model
    from django.db.models.signals import post_save

    celery_signals.task_prerun.connect(_task_started, dispatch_uid="conch-audit-task-started")
    celery_signals.task_postrun.connect(_task_finished, dispatch_uid="conch-audit-task-finished")
    post_save.connect(_log_entry_saved, sender=LogEntry, dispatch_uid="conch-audit-admin-log")
    audit_admin_deletions(Team, Membership, ApiToken, TeamQuota, get_user_model())
