from django.contrib import admin

from conch.admin_base import ReadOnlyModelAdmin
from models_registry.models import ModelVersion, RegisteredModel


@admin.register(RegisteredModel)
class RegisteredModelAdmin(ReadOnlyModelAdmin):
    """Registered models, read-only: `DELETE /api/v1/models/ID/` deletes one with its objects in the store."""

    list_display = ["name", "team", "created_at"]
    list_filter = ["team"]


@admin.register(ModelVersion)
class ModelVersionAdmin(ReadOnlyModelAdmin):
    """Model versions, read-only: the build pipeline sets their status."""

    list_display = ["model", "number", "status", "source_size_bytes", "created_at"]
    list_filter = ["status"]
