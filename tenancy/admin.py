from django.contrib import admin

from tenancy.models import ApiToken, AuditEntry, Membership, Team, TeamQuota


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class TeamQuotaInline(admin.StackedInline):
    model = TeamQuota
    extra = 0
    max_num = 1
    can_delete = True
    verbose_name = "quota (empty limits use the CONCH_QUOTA_* defaults)"
    fields = ["gpus", "instances", "storage_bytes", "registered_models", "deployments"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    inlines = [MembershipInline, TeamQuotaInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "team", "name", "expires_at", "last_used_at", "is_revoked"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    list_filter = ["team", "is_revoked"]


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """The audit log of every team, for staff: read-only (no add, change or delete, no actions)."""

    list_display = ["created_at", "team_slug", "actor", "token_prefix", "source", "action", "object_repr", "ip"]
    list_filter = ["action", "source", "object_type", "team"]
    search_fields = ["actor", "token_prefix", "object_repr", "object_id", "team_slug", "ip"]
    date_hierarchy = "created_at"
    actions = None

    def has_view_permission(self, request, obj=None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
