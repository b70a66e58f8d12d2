"""Template filters of the console pages."""

from __future__ import annotations

from collections.abc import Mapping

from django import template
from django.template.defaultfilters import filesizeformat

register = template.Library()


@register.filter
def needs_field_prefix(detail: str, field: str) -> bool:
    """Whether an error's `detail` should be shown after its `field` name ("field: detail"): not when there is no
    field, nor when the sentence already begins with it ("max_batch_size must be …")."""
    return bool(field) and not str(detail).startswith(str(field))


@register.filter
def slot_errors(fit: dict | None, slot: str) -> list[str]:
    """The deploy check's refusals shown in the form's slot `slot` (see `console.wizard_views._fit`)."""
    return dict((fit or {}).get("slots") or ()).get(slot, [])


#: Quota fields as counted things: (one, many).
_QUOTA_NOUNS = {
    "deployments": ("deployment", "deployments"),
    "instances": ("instance", "instances"),
    "gpu": ("GPU", "GPUs"),
    "models": ("model", "models"),
}


@register.filter
def quota_amount(amount, field: str) -> str:
    """`amount` of the quota field `field` in words: "1 deployment", "2 instances"; storage in bytes ("1.5 GB of
    storage"); a
    field not known here reads as its name. GPUs come as {resource name: count} (`gpu_request`), each resource in
    its own words: "2 GPUs (nvidia.com/gpu)", "1 MIG slice (nvidia.com/mig-1g.10gb)"; none: "no GPU"."""
    if field == "storage_bytes":
        return f"{filesizeformat(amount)} of storage"
    if isinstance(amount, Mapping):
        if not amount:
            return "no GPU"
        return ", ".join(_gpu_amount(count, resource) for resource, count in amount.items())
    one, many = _QUOTA_NOUNS.get(field, (field, field))
    return f"{amount} {one if amount == 1 else many}"


def _gpu_amount(count: int, resource: str) -> str:
    one, many = ("MIG slice", "MIG slices") if resource.startswith("nvidia.com/mig-") else _QUOTA_NOUNS["gpu"]
    return f"{count} {one if count == 1 else many} ({resource})"
