from django.contrib import admin
from unfold.admin import ModelAdmin

from models_registry.models import ModelVersion, RegisteredModel


@admin.register(RegisteredModel)
class RegisteredModelAdmin(ModelAdmin):
    list_display = ["name", "team", "created_at"]
    list_filter = ["team"]


@admin.register(ModelVersion)
class ModelVersionAdmin(ModelAdmin):
    list_display = ["model", "number", "status", "source_size_bytes", "created_at"]
    list_filter = ["status"]
    readonly_fields = ["source_key", "source_sha256", "source_size_bytes", "signature", "config_pbtxt"]
