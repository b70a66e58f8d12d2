from django.contrib import admin

from tenancy.models import ApiToken, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    inlines = [MembershipInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "team", "name", "expires_at", "last_used_at", "is_revoked"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    list_filter = ["team", "is_revoked"]
