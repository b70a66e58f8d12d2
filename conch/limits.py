"""Request body limits per endpoint: what each view accepts, and the 413 that says so.

Every request body is checked against the limit of the view that will read it, from the declared Content-Length,
before anything reads a byte (`conch.middleware.RequestBodyLimitMiddleware`). A view declares its limit with
`@accepts_body(LIMIT)` on a function view or a DRF handler/action, or `body_limit = LIMIT` on a view class; a view
that declares nothing gets `JSON_BODY` (CONCH_MAX_JSON_BODY_BYTES, 1 MiB by default): JSON bodies of the API,
console and admin forms. `STREAMED` marks a view that enforces its own limit while it streams the body (model
uploads: `conch.upload_handlers`), so the refusal can name the file.

Under ASGI (`python -m conch.web`), Django's handler spools the whole body (to disk past 2.5 MB) before any
middleware runs, so `conch.asgi` applies the same limits before that: a declared length over the view's limit is
answered 413 without reading a byte, and a chunked body once it passes the limit (plus, for a STREAMED view, room
for its other form fields: `conch.middleware.transfer_limit`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings

from conch.errors import PayloadTooLarge

F = TypeVar("F", bound=Callable[..., Any])

_UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


@dataclass(frozen=True)
class BodyLimit:
    """The largest body a view accepts: `settings.<setting>` bytes (0 without a setting) plus `extra_bytes`.

    `variable` is the environment variable that sets it, named in the refusal so an administrator knows what to
    raise (None: a fixed limit); `field` is the request field the refusal names (None: the body as a whole).
    """

    setting: str | None
    variable: str | None
    field: str | None = None
    extra_bytes: int = 0

    def max_bytes(self) -> int:
        """The limit now, in bytes (settings are read at each call)."""
        configured = int(getattr(settings, self.setting)) if self.setting else 0
        return configured + self.extra_bytes

    def refusal(self, length: int) -> PayloadTooLarge:
        """The 413 for a body of `length` bytes over this limit."""
        limit = self.max_bytes()
        raise_it = f" (an administrator sets the limit with {self.variable})" if self.variable else ""
        return PayloadTooLarge(
            f"The request body is {length} bytes, larger than the {describe_bytes(limit)} ({limit} bytes) this "
            f"endpoint accepts; send less data per request{raise_it}.",
            field=self.field,
        )


#: JSON bodies of the API, console and admin forms: every view that declares nothing else.
JSON_BODY = BodyLimit(setting="CONCH_MAX_JSON_BODY_BYTES", variable="CONCH_MAX_JSON_BODY_BYTES")
#: An inference request read into memory (Django's own limit on `request.body`, 64 MiB by default).
INFERENCE_BODY = BodyLimit(setting="DATA_UPLOAD_MAX_MEMORY_SIZE", variable="CONCH_MAX_REQUEST_BODY_BYTES")
#: The view streams the body and enforces its own limit as it goes (uploads to the object store).
STREAMED = BodyLimit(setting="CONCH_MAX_UPLOAD_BYTES", variable="CONCH_MAX_UPLOAD_BYTES", field="file")


def body_limit_of(view: Callable[..., Any], method: str) -> BodyLimit:
    """The limit `view` (a resolved URL's callback) declares for `method`: on its DRF handler or action, else on its
    class, else on the function; JSON_BODY when none does."""
    cls = getattr(view, "cls", None) or getattr(view, "view_class", None)
    if cls is None:
        return getattr(view, "body_limit", None) or JSON_BODY
    actions = getattr(view, "actions", None) or {}
    handler = getattr(cls, actions.get(method.lower(), method.lower()), None)
    return getattr(handler, "body_limit", None) or getattr(cls, "body_limit", None) or JSON_BODY


def accepts_body(limit: BodyLimit) -> Callable[[F], F]:
    """Declare the body limit of a function view or a DRF handler/action (`@action` keeps the attribute)."""

    def mark(view: F) -> F:
        view.body_limit = limit  # type: ignore[attr-defined]
        return view

    return mark


def describe_bytes(size: int) -> str:
    """`size` in the largest binary unit it reaches: "1 MiB", "4 GiB", "1.5 KiB", "512 bytes"."""
    for unit, factor in _UNITS:
        if size >= factor:
            value = size / factor
            shown = f"{value:.0f}" if value == int(value) else f"{value:.1f}"
            return f"{shown} {unit}"
    return f"{size} bytes"
