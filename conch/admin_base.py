"""What the apps' admin modules share: the theme's base class, and a read-only one."""

from __future__ import annotations

from django.db import models
from django.http import HttpRequest
from unfold.admin import ModelAdmin

__all__ = ["ReadOnlyModelAdmin"]


class ReadOnlyModelAdmin(ModelAdmin):
    """Rows staff may list and open but not add, change or delete in the admin: their app's services (through
    the API and the console) are the only writers, so their checks always apply (e.g. deleting a model through
    its service also empties its folder in the object store and frees its storage)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False
