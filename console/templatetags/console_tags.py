"""Template filters of the console pages."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def needs_field_prefix(detail: str, field: str) -> bool:
    """Whether an error's `detail` should be shown after its `field` name ("field: detail"): not when there is no
    field, nor when the sentence already begins with it ("max_batch_size must be …")."""
    return bool(field) and not str(detail).startswith(str(field))
