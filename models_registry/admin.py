from django.contrib import admin
from django.http import HttpRequest
from unfold.admin import ModelAdmin

from models_registry.models import ModelVersion, RegisteredModel


class ReadOnlyAdmin(ModelAdmin):
    """Shown to staff, changed only through the API: a model or version deleted here would leave its objects in
    the store and its storage counted (`models_registry.deletion` does it right), a status set here would
    contradict the build pipeline."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(RegisteredModel)
class RegisteredModelAdmin(ReadOnlyAdmin):
    list_display = ["name", "team", "created_at"]
    list_filter = ["team"]


@admin.register(ModelVersion)
class ModelVersionAdmin(ReadOnlyAdmin):
    list_display = ["model", "number", "status", "source_size_bytes", "created_at"]
    list_filter = ["status"]
