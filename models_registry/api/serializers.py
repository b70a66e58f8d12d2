"""Serializers of the model registry API (shapes of requests and responses)."""

from __future__ import annotations

from rest_framework import serializers

from models_registry.models import RegisteredModel


class RegisteredModelSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    latest_version = serializers.SerializerMethodField(help_text="The id of the newest version (null: none yet).")
    latest_version_number = serializers.SerializerMethodField(
        help_text="The number of the newest version, as in MODEL:NUMBER (null: none yet)."
    )

    class Meta:
        model = RegisteredModel
        fields = ["id", "name", "team", "created_at", "latest_version", "latest_version_number"]

    def get_latest_version(self, obj: RegisteredModel) -> int | None:
        latest = obj.versions.order_by("-number").first()
        return latest.pk if latest else None

    def get_latest_version_number(self, obj: RegisteredModel) -> int | None:
        latest = obj.versions.order_by("-number").first()
        return latest.number if latest else None


class CreateModelSerializer(serializers.Serializer):
    name = serializers.CharField(allow_blank=True, help_text="Lowercase DNS label, at most 63 characters.")
    team = serializers.CharField(max_length=63, help_text="Slug of one of your teams.")
