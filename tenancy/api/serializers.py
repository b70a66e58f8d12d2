from django.conf import settings
from rest_framework import serializers

from tenancy.choices import AuditAction, AuditSource, Role, Scope
from tenancy.models import ApiToken, AuditEntry, Membership, Team


class TeamSerializer(serializers.ModelSerializer):
    class Meta:
        model = Team
        fields = ["id", "slug", "name", "created_at"]


class ApiTokenSerializer(serializers.ModelSerializer):
    """A token as lists show it: never its secret nor its hash."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    user = serializers.SlugRelatedField(slug_field="username", read_only=True)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices))
    deployments = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "user",
            "team",
            "scopes",
            "deployments",
            "expires_at",
            "created_at",
            "last_used_at",
        ]


class CreatedApiTokenSerializer(ApiTokenSerializer):
    """A token just created, with its secret: the one time it is shown."""

    token = serializers.CharField(help_text="The secret: send it as 'Authorization: Bearer <token>'. Shown once.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class CreateApiTokenSerializer(serializers.Serializer):
    team = serializers.SlugField(max_length=63, help_text="Slug of the team the token acts in.")
    name = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=Scope.choices),
        required=False,
        allow_empty=False,
        help_text="What the token may do; default: every scope the caller's role in the team can use (a viewer's "
        "token: read only; a scope the role cannot use is refused with 403 naming `scopes`).",
    )
    deployments = serializers.ListField(
        child=serializers.CharField(max_length=63),
        required=False,
        help_text="Limit deployment writes and inference to these deployment names; default: any.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The bound is a setting, read when a request (or the schema) is made, not at import.
        self.fields["expires_in_days"] = serializers.IntegerField(
            min_value=1,
            max_value=settings.CONCH_TOKEN_MAX_DAYS,
            required=False,
            help_text="Days until it expires (default CONCH_TOKEN_DEFAULT_DAYS, at most CONCH_TOKEN_MAX_DAYS).",
        )


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


class AuditEntrySerializer(serializers.ModelSerializer):
    """One entry of the audit log."""

    team = serializers.CharField(source="team_slug", help_text="Slug of the team, empty for none (a cluster).")
    actor = serializers.CharField(help_text="Username of who acted, or 'system' (a command, task or beat).")
    token_prefix = serializers.CharField(help_text="Prefix of the API token the request was made with, or empty.")
    source = serializers.ChoiceField(choices=AuditSource.choices)
    source_detail = serializers.CharField(help_text="The command or task name, or the request's method and path.")
    action = serializers.ChoiceField(choices=AuditAction.choices)
    before = serializers.DictField(help_text="A few fields as they were.")
    after = serializers.DictField(help_text="A few fields as they became.")

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "created_at",
            "team",
            "actor",
            "token_prefix",
            "source",
            "source_detail",
            "ip",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "before",
            "after",
        ]
        read_only_fields = fields


class AuditFilterSerializer(serializers.Serializer):
    """Query parameters of the audit log; each one narrows the list, all of them together."""

    team = serializers.SlugField(max_length=63, required=False, help_text="Only this team's entries.")
    action = serializers.ChoiceField(choices=AuditAction.choices, required=False)
    object_type = serializers.RegexField(
        r"^[a-z_]{1,40}$",
        required=False,
        help_text="deployment, model, version, token, membership, quota, team, cluster, user, …",
        error_messages={"invalid": "Give an object type in lowercase letters, such as deployment."},
    )
    object_id = serializers.CharField(max_length=64, required=False)
    user = serializers.CharField(max_length=150, required=False, help_text="Username of who acted, or 'system'.")
    source = serializers.ChoiceField(choices=AuditSource.choices, required=False)
    since = serializers.DateTimeField(required=False, help_text="Entries at or after this time (ISO 8601).")
    until = serializers.DateTimeField(required=False, help_text="Entries before this time (ISO 8601).")

    def validate(self, attrs):
        since, until = attrs.get("since"), attrs.get("until")
        if since is not None and until is not None and until <= since:
            raise serializers.ValidationError({"until": "until must be later than since."})
        return attrs


class MemberSerializer(serializers.ModelSerializer):
    """A member of a team and their role."""

    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "created_at"]


class AddMemberSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150, help_text="An existing user's username.")
    role = serializers.ChoiceField(choices=Role.choices, default=Role.DEVELOPER)


class ChangeMemberSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)
