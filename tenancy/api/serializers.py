from rest_framework import serializers

from tenancy.models import Team


class TeamSerializer(serializers.ModelSerializer):
    class Meta:
        model = Team
        fields = ["id", "slug", "name", "created_at"]
