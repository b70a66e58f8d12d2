"""The one typed reader of environment variables (12-factor settings).

Every variable Conch reads is documented in `.env.example`. A required variable that
is missing, or a value that cannot be parsed, stops start-up with `ImproperlyConfigured`
naming the variable.
"""

from __future__ import annotations

import os
import re
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


# A label key: an optional DNS-subdomain prefix and "/", then a name; a value: the same name form or empty
# (Kubernetes "Labels and Selectors", "Syntax and character set").
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"({_LABEL_NAME})?")


def env_labels(name: str, default: str = "") -> dict[str, str]:
    """Return environment variable `name`, a Kubernetes equality selector `key=value[,key=value...]`, as a dict.

    An empty value is an empty dict. Keys and values follow Kubernetes "Labels and Selectors" (a key may carry a
    `prefix/`). Raises ImproperlyConfigured naming the variable and the pair at fault.
    """
    raw = os.environ.get(name, default)
    found: dict[str, str] = {}
    for pair in (item.strip() for item in raw.split(",")):
        if not pair:
            continue
        key, equals, value = (part.strip() for part in pair.partition("="))
        if not equals or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise ImproperlyConfigured(
                f"Environment variable {name}={raw!r}: {pair!r} is not a Kubernetes label 'key=value'."
            )
        found[key] = value
    return found
