"""Template filters of the console pages."""

from __future__ import annotations

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
    """`amount` of the quota field `field` in words: "1 deployment", "2 instances", "1 GPU"; storage in bytes
    ("1.5 GB"); a field not known here reads as its name."""
    if field == "storage_bytes":
        return filesizeformat(amount)
    one, many = _QUOTA_NOUNS.get(field, (field, field))
    return f"{amount} {one if amount == 1 else many}"
