"""The one typed reader of environment variables (12-factor settings).

Every variable Conch reads is documented in `.env.example`. A required variable that
is missing, or a value that cannot be parsed, stops start-up with `ImproperlyConfigured`
naming the variable.
"""

from __future__ import annotations

import os
from typing import TypeVar, overload

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")
_MISSING = object()
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@overload
def env(name: str, default: str = ...) -> str: ...


@overload
def env(name: str, default: T = ..., *, cast: type[T]) -> T: ...


def env(name: str, default: object = _MISSING, *, cast: type[object] = str) -> object:
    """Return environment variable `name` converted to `cast` (str, int, float, bool, list).

    `list` splits on commas and drops empty items. Without a `default` the variable is
    required. Raises ImproperlyConfigured when it is missing or does not parse.
    """
    raw = os.environ.get(name)
    if raw is None:
        if default is _MISSING:
            raise ImproperlyConfigured(f"Environment variable {name} is required; see .env.example.")
        return default
    try:
        if cast is bool:
            lowered = raw.strip().lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
            raise ValueError(raw)
        if cast is list:
            return [item.strip() for item in raw.split(",") if item.strip()]
        # cast is str, int or float here (bool and list are handled above): each takes the one string.
        return cast(raw)  # type: ignore[call-arg]
    except ValueError as exc:
        raise ImproperlyConfigured(f"Environment variable {name}={raw!r} is not a valid {cast.__name__}.") from exc
