"""Runtimes: where deployments run. `base` holds the interface; one module per runtime implements it."""

from __future__ import annotations

from deployments.runtimes.base import Runtime


def get_runtime(name: str) -> Runtime:
    """The runtime called `name` ("local" or "kubernetes"). Raises KeyError for a runtime this installation does
    not have."""
    if name == "local":
        from deployments.runtimes.local import LocalRuntime

        return LocalRuntime()
    if name == "kubernetes":
        from deployments.runtimes.kubernetes.directory import RegisteredClusters
        from deployments.runtimes.kubernetes.runtime import KubernetesRuntime

        return KubernetesRuntime(RegisteredClusters())
    raise KeyError(name)
