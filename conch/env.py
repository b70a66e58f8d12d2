"""The one typed reader of environment variables (12-factor settings).

Every variable Conch reads is documented in `.env.example`. A required variable that
is missing, or a value that cannot be parsed, stops start-up with `ImproperlyConfigured`
naming the variable.
"""

from __future__ import annotations

import os
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")
_MISSING = object()
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env(name: str, default: object = _MISSING, *, cast: type[T] = str) -> T:
    """Return environment variable `name` converted to `cast` (str, int, float, bool, list).

    `list` splits on commas and drops empty items. Without a `default` the variable is
    required. Raises ImproperlyConfigured when it is missing or does not parse.
    """
    raw = os.environ.get(name)
    if raw is None:
        if default is _MISSING:
            raise ImproperlyConfigured(f"Environment variable {name} is required; see .env.example.")
        return default  # type: ignore[return-value]
    try:
        if cast is bool:
            lowered = raw.strip().lower()
            if lowered in _TRUE:
                return True  # type: ignore[return-value]
            if lowered in _FALSE:
                return False  # type: ignore[return-value]
            raise ValueError(raw)
        if cast is list:
            return [item.strip() for item in raw.split(",") if item.strip()]  # type: ignore[return-value]
        return cast(raw)  # type: ignore[call-arg]
    except ValueError as exc:
        raise ImproperlyConfigured(f"Environment variable {name}={raw!r} is not a valid {cast.__name__}.") from exc
