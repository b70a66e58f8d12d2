"""Runtimes: where deployments run. `base` holds the interface; one module per runtime implements it."""

from __future__ import annotations

from deployments.runtimes.base import Runtime


def get_runtime(name: str) -> Runtime:
    """The runtime called `name` ("local"). Raises KeyError for a runtime this installation does not have."""
    from deployments.runtimes.local import LocalRuntime

    runtimes = {"local": LocalRuntime}
    return runtimes[name]()
