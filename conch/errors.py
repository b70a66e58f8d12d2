"""Typed errors shared by every app.

Services and adapters raise these (or subclasses); the REST API's exception handler
(`conch.api.exception_handler`) turns them into `{"detail": ..., "field": ...}` bodies
with the status code named on each class. Adapters never let a client library's own
exception (botocore, tritonclient, kubernetes) escape: they wrap it in one of these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class ConchError(Exception):
    """Base class. `detail` is a sentence a user can act on; `field` names the input at fault.

    `refusals`: when a check gathered several errors (`refuse_all`), every one of them, this one first; the API
    lists them under `errors`. Empty for an error raised on its own."""

    status_code = 500

    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.refusals: tuple[ConchError, ...] = ()


def attempt(refusals: list[ConchError], check: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """Run `check(*args, **kwargs)`; a ConchError it raises is appended to `refusals` instead of propagating.

    Returns (True, its result) or (False, None). For checks that report every refused field at once."""
    try:
        return True, check(*args, **kwargs)
    except ConchError as exc:
        refusals.append(exc)
        return False, None


def refuse_all(refusals: Sequence[ConchError]) -> ConchError:
    """The error to raise for gathered `refusals` (not empty): the first of them (its class, status, detail and
    field are the response's, as when it was raised alone), carrying all of them as `refusals`."""
    first = refusals[0]
    first.refusals = tuple(refusals)
    return first


def refuse_each(refusals: Sequence[ConchError]) -> ConchError:
    """The error to raise for gathered `refusals` (not empty): the only one as it was raised, or, for several,
    `refuse_all(refusals)` (the API then lists them under `errors`). For checks whose single refusal keeps the
    answer it always had."""
    return refusals[0] if len(refusals) == 1 else refuse_all(refusals)


class InvalidInput(ConchError):
    """The caller sent a value that breaks a rule (HTTP 400)."""

    status_code = 400


class Unauthenticated(ConchError):
    """The credentials sent are no longer good (an expired or revoked token) (HTTP 401)."""

    status_code = 401


class Forbidden(ConchError):
    """The caller is known but lacks the role or token scope an action needs; `detail` names it (HTTP 403)."""

    status_code = 403


class NotFound(ConchError):
    """The object does not exist, or is not visible to the caller's teams (HTTP 404)."""

    status_code = 404


class Conflict(ConchError):
    """The request clashes with current state, e.g. a duplicate name (HTTP 409)."""

    status_code = 409


class QuotaExceeded(Conflict):
    """A team's quota would be exceeded (HTTP 409); `quota` is {"limit", "used", "requested"} of the resource."""

    def __init__(self, detail: str, *, field: str, limit: int, used: int, requested: int) -> None:
        super().__init__(detail, field=field)
        self.quota = {"limit": limit, "used": used, "requested": requested}


class InUse(Conflict):
    """An object cannot go while others use it (HTTP 409); `users` is [{"id", "name"}] of what uses it."""

    def __init__(self, detail: str, *, field: str, users: list[dict[str, object]]) -> None:
        super().__init__(detail, field=field)
        self.users = users


class Duplicate(Conflict):
    """The request would make a copy of an object that exists (HTTP 409); `existing` describes that object (e.g.
    {"id", "number", "status"} of a version) and the API puts it under `existing_name` (e.g. "existing_version")."""

    def __init__(self, detail: str, *, field: str, existing_name: str, existing: dict[str, object]) -> None:
        super().__init__(detail, field=field)
        self.existing_name = existing_name
        self.existing = existing


class PayloadTooLarge(ConchError):
    """A request body or upload is larger than the endpoint's limit (HTTP 413); `detail` says the limit."""

    status_code = 413


class RateLimited(ConchError):
    """The caller used up its request budget (HTTP 429); `retry_after_seconds` becomes the Retry-After header."""

    status_code = 429

    def __init__(self, detail: str, *, retry_after_seconds: int, field: str | None = None) -> None:
        super().__init__(detail, field=field)
        self.retry_after_seconds = retry_after_seconds


class Unavailable(ConchError):
    """An external system (object store, Triton, Kubernetes) cannot be reached; retry later (HTTP 503)."""

    status_code = 503


class UnsupportedMediaType(ConchError):
    """The request body is not in a format the endpoint reads (HTTP 415)."""

    status_code = 415
