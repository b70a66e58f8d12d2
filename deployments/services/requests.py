"""What a caller asks to deploy, as one frozen value each service of the create path takes.

Values are as a client sent them (the API's JSON after its serializer, or a console form's text: a whole number may
still be its text): the services check each one and name the field of every refusal (`plan_deployment`,
`check_placement`), so a request that reached them is not yet a valid one. Pure data: no Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from deployments.choices import RuntimeName


@dataclass(frozen=True)
class PlacementRequest:
    """Where a deployment runs: the runtime and, for `kubernetes` only, the cluster and the pods' shape.

    `cluster`: a registered cluster's name; `replicas` (pods) or `autoscaling` ({"min_replicas", "max_replicas",
    "target_queue_time_us" | "target_cpu_percent"}); `gpu` per pod ({"count", "product"} or {"mig_profile"}; None:
    CPU only); `cpu` and `memory`: Kubernetes quantities requested per pod ("2", "500m", "4Gi"). For the `local`
    runtime every one of them must be None (`check_placement` refuses each one given).
    """

    runtime: str = RuntimeName.LOCAL
    cluster: str | None = None
    replicas: int | str | None = None
    autoscaling: Mapping[str, Any] | None = None
    gpu: Mapping[str, Any] | None = None
    cpu: str | None = None
    memory: str | None = None

    def given(self) -> dict[str, Any]:
        """The placement fields (all but `runtime`) by name, as given (None when absent)."""
        return {name: getattr(self, name) for name in _PLACEMENT_FIELDS}


_PLACEMENT_FIELDS = ("cluster", "replicas", "autoscaling", "gpu", "cpu", "memory")


@dataclass(frozen=True)
class DeploymentRequest:
    """A request to deploy model version `model_version_id` as `name` in team `team_slug`.

    `placement`: where it runs (`PlacementRequest`). The options override the version's model configuration
    (Triton "Model Configuration"): `instance_count` (instance group count: concurrent model execution),
    `instance_kind` (KIND_AUTO, KIND_CPU or KIND_GPU; None: as built), `max_batch_size`,
    `max_queue_delay_microseconds` (the dynamic batcher's, microseconds); None keeps the built value.
    """

    team_slug: str
    name: str
    model_version_id: int
    placement: PlacementRequest = field(default_factory=PlacementRequest)
    instance_count: int | str | None = None
    instance_kind: str | None = None
    max_batch_size: int | str | None = None
    max_queue_delay_microseconds: int | str | None = None

    @property
    def runtime(self) -> str:
        """The placement's runtime (`local` or `kubernetes`)."""
        return self.placement.runtime

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> DeploymentRequest:
        """Build a request from flat fields, as the create API's body names them after parsing (`team_slug`,
        `name`, `model_version_id`, `runtime`, the placement's and the options' names). Raises TypeError for a name
        it does not know (a caller's bug, not a user's input)."""
        own = {f.name for f in fields(cls)} - {"placement"}
        placement_names = {"runtime", *_PLACEMENT_FIELDS}
        unknown = set(values) - own - placement_names
        if unknown:
            raise TypeError(f"DeploymentRequest has no field {sorted(unknown)[0]!r}")
        placement = PlacementRequest(**{k: v for k, v in values.items() if k in placement_names})
        return cls(placement=placement, **{k: v for k, v in values.items() if k in own})
