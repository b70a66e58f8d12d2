from django.contrib import admin

from tenancy.models import ApiToken, Membership, Team, TeamQuota


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
