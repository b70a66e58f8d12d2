from rest_framework import serializers

from tenancy.models import Team


class TeamSerializer(serializers.ModelSerializer):
    class Meta:
        model = Team
        fields = ["id", "slug", "name", "created_at"]


class UsageLineSerializer(serializers.Serializer):
    field = serializers.CharField(help_text="The quota: gpu, instances, storage_bytes, models or deployments.")
    unit = serializers.CharField(help_text="What is counted (for gpu: nvidia.com/gpu or nvidia.com/mig-<profile>).")
    limit = serializers.IntegerField()
    used = serializers.IntegerField()
    is_default = serializers.BooleanField(help_text="The limit is the installation's default (CONCH_QUOTA_*).")


class TeamUsageSerializer(serializers.Serializer):
    team = serializers.CharField()
    quotas = UsageLineSerializer(many=True)


class QuotaUpdateSerializer(serializers.Serializer):
    """Limits to set; null puts a limit back to the default. Every field is optional."""

    gpu = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)
    instances = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)
    storage_bytes = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**63 - 1)
    models = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)
    deployments = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)
