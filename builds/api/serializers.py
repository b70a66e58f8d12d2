"""Serializers of build data, embedded in the model registry's version responses."""

from rest_framework import serializers

from builds.models import BuildStep


class BuildStepSerializer(serializers.ModelSerializer):
    """One build step: name, status, log lines (each "HH:MM:SS message"), start and finish times."""

    class Meta:
        model = BuildStep
        fields = ["name", "status", "log", "started_at", "finished_at"]
