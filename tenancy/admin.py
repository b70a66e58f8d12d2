"""The admin console of teams (staff only, at /admin/): usage against limits, limits, members, tokens.

An HTTP edge like the API: it shows what `tenancy.quotas` counts and changes things through `tenancy.services`
and `tenancy.quotas`, so the same rules hold as through the API. Usage of resources other apps own
(deployments, GPUs, models, storage) comes from the counters those apps register with `tenancy.quotas`; this
module imports none of them.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin as DjangoGroupAdmin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.models import Group
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.defaultfilters import filesizeformat
from django.template.loader import render_to_string
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from unfold.admin import ModelAdmin, StackedInline, TabularInline
from unfold.forms import AdminPasswordChangeForm, UserChangeForm, UserCreationForm
from unfold.widgets import UnfoldAdminIntegerFieldWidget

from conch.admin_base import ReadOnlyModelAdmin
from conch.errors import ConchError, InvalidInput
from tenancy.audit import record_audit
from tenancy.choices import AuditAction
from tenancy.members import teams_left_without_admin
from tenancy.models import ApiToken, AuditEntry, Membership, Team, TeamQuota
from tenancy.quotas import FIELDS, NEAR_LIMIT_SHARE, Usage, check_limit, team_ids_by_share, teams_usage
from tenancy.services import (
    change_team_quota,
    ensure_membership,
    remove_membership,
    revoke_api_token,
    set_token_rate_limit,
)

User = get_user_model()

# --- users and groups, in the theme's forms ------------------------------------------

admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class UserAdmin(DjangoUserAdmin, ModelAdmin):
    """Users, in the theme's forms. A user who is the last admin of a team cannot be deleted (as the members API
    refuses to remove one): the delete page lists those teams as protected."""

    form = UserChangeForm
    add_form = UserCreationForm
    change_password_form = AdminPasswordChangeForm

    def get_deleted_objects(self, objs, request: HttpRequest):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        for team in teams_left_without_admin(user_ids=[user.pk for user in objs]):
            protected = [*protected, f"team {team.slug}: its last admin; make another member admin first"]
        return deleted, counts, perms_needed, protected


@admin.register(Group)
class GroupAdmin(DjangoGroupAdmin, ModelAdmin):
    pass


# --- teams: usage bars, limits and members inline -----------------------------------------

#: Bars of the team list: (quota field, column title). Instances are local-runtime model instances.
BARS = [
    ("gpu", "GPUs"),
    ("storage_bytes", "Storage"),
    ("deployments", "Deployments"),
    ("models", "Models"),
    ("instances", "Local instances"),
]


def _amount(field: str, value: int) -> str:
    return filesizeformat(value) if field == "storage_bytes" else str(value)


def usage_bar(lines: list[Usage], field: str) -> SafeString:
    """HTML of one quota's bar: used of limit (storage human-readable, e.g. 1.5 GB), one bar per unit (a MIG
    profile's slices apart from whole GPUs); red over the limit, orange from NEAR_LIMIT_SHARE of it, "default"
    when the limit is the CONCH_QUOTA_* setting."""
    bars = []
    for line in (line for line in lines if line.field == field):
        share = line.share
        colour = "bg-red-600" if share > 1 else "bg-orange-500" if share >= NEAR_LIMIT_SHARE else "bg-primary-600"
        percent = round(share * 100) if share != float("inf") else 100
        context = {
            "field": field,
            "unit": line.unit,
            "unit_text": "" if line.unit == FIELDS[field][2] else line.unit,
            "used": line.used,
            "limit": line.limit,
            "used_text": _amount(field, line.used),
            "limit_text": _amount(field, line.limit),
            "is_default": line.is_default,
            "over": share > 1,
            "percent": percent,
            # A little of the bar shows for any use, however small beside the limit.
            "width": min(100, max(percent, 2 if line.used else 0)),
            "colour": colour,
        }
        bars.append((render_to_string("admin/tenancy/usage_bar.html", context),))
    return format_html_join("", "{}", bars)


class QuotaPressureFilter(admin.SimpleListFilter):
    """Teams near (some quota at NEAR_LIMIT_SHARE of its limit or more) or over (above it) a limit."""

    title = "quota use"
    parameter_name = "quota"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [
            ("near", f"Near a limit (≥ {NEAR_LIMIT_SHARE:.0%} of one)"),
            ("over", "Over a limit (above one)"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Team]) -> QuerySet[Team] | None:
        if self.value() not in ("near", "over"):
            return None
        ids = team_ids_by_share(teams=queryset, at_least=NEAR_LIMIT_SHARE, over=self.value() == "over")
        return queryset.filter(pk__in=ids)


class TeamChangeList(ChangeList):
    """The team list, counting the usage of the teams on the page at once (`teams_usage`: a fixed number of
    queries for the page, whatever its size)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        usage = teams_usage(teams=self.result_list)
        for team in self.result_list:
            team.quota_usage = usage[team.pk]


_NUMBER = UnfoldAdminIntegerFieldWidget


class TeamQuotaForm(forms.ModelForm):
    """A team's limits; empty means the CONCH_QUOTA_* default. Each value is checked by the quota service's own
    rule (`tenancy.quotas.check_limit`), and saved through it (`TeamAdmin.save_formset`)."""

    # No bounds of their own: check_limit says what is allowed, in the API's words.
    gpus = forms.IntegerField(
        required=False, widget=_NUMBER, label="GPUs", help_text="nvidia.com/gpu, and as many of each MIG profile."
    )
    instances = forms.IntegerField(
        required=False, widget=_NUMBER, label="Local instances", help_text="Model instances of local deployments."
    )
    storage_bytes = forms.IntegerField(
        required=False, widget=_NUMBER, label="Storage (bytes)", help_text="10737418240 bytes are 10 GiB."
    )
    registered_models = forms.IntegerField(required=False, widget=_NUMBER, label="Models")
    deployments = forms.IntegerField(required=False, widget=_NUMBER, label="Deployments")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for field, (column, setting, _, _) in FIELDS.items():
            default = int(getattr(settings, setting))
            shown = f"{default} ({filesizeformat(default)})" if field == "storage_bytes" else str(default)
            self.fields[column].help_text = f"{self.fields[column].help_text} Empty: the default, {shown}.".strip()

    class Meta:
        model = TeamQuota
        fields = [column for column, _, _, _ in FIELDS.values()]

    def clean(self) -> dict:
        cleaned = super().clean()
        for field, (column, _, _, _) in FIELDS.items():
            if column in cleaned:
                try:
                    check_limit(field=field, value=cleaned[column])
                except InvalidInput as error:
                    self.add_error(column, error.detail)
        return cleaned

    def limits(self) -> dict[str, int | None]:
        """The changed limits, by quota field (as `set_quota` takes them)."""
        return {
            field: self.cleaned_data[column]
            for field, (column, _, _, _) in FIELDS.items()
            if column in self.changed_data
        }


class TeamQuotaInline(StackedInline):
    model = TeamQuota
    form = TeamQuotaForm
    extra = 1
    max_num = 1
    can_delete = False
    verbose_name = "limits"
    verbose_name_plural = "limits (empty: the CONCH_QUOTA_* default)"


class MembershipForm(forms.ModelForm):
    class Meta:
        model = Membership
        fields = ["user", "role"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            # A membership is a user's: change its role or remove it, add another user as a new row.
            self.fields["user"].disabled = True


class MembershipInline(TabularInline):
    model = Membership
    form = MembershipForm
    extra = 0
    autocomplete_fields = ["user"]
    verbose_name = "member"


@admin.register(Team)
class TeamAdmin(ModelAdmin):
    """Teams with their usage against their limits; limits and members are edited inline on a team's page."""

    list_display = ["slug", "name", "gpu_bar", "storage_bar", "deployments_bar", "models_bar", "instances_bar"]
    list_display += ["members"]
    list_filter = [QuotaPressureFilter]
    search_fields = ["slug", "name"]
    readonly_fields = ["usage", "created_at"]
    fields = ["slug", "name", "allow_pickled_models", "usage", "created_at"]
    inlines = [TeamQuotaInline, MembershipInline]
    list_per_page = 100

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        return super().get_queryset(request).annotate(member_count=Count("memberships"))

    def get_changelist(self, request: HttpRequest, **kwargs) -> type[ChangeList]:
        return TeamChangeList

    @admin.display(description="GPUs")
    def gpu_bar(self, team: Team) -> SafeString:
        return usage_bar(team.quota_usage, "gpu")

    @admin.display(description="Storage")
    def storage_bar(self, team: Team) -> SafeString:
        return usage_bar(team.quota_usage, "storage_bytes")

    @admin.display(description="Deployments")
    def deployments_bar(self, team: Team) -> SafeString:
        return usage_bar(team.quota_usage, "deployments")

    @admin.display(description="Models")
    def models_bar(self, team: Team) -> SafeString:
        return usage_bar(team.quota_usage, "models")

    @admin.display(description="Local instances")
    def instances_bar(self, team: Team) -> SafeString:
        return usage_bar(team.quota_usage, "instances")

    @admin.display(description="Members", ordering="member_count")
    def members(self, team: Team) -> int:
        return team.member_count

    @admin.display(description="Usage now (against the limits)")
    def usage(self, team: Team) -> SafeString | str:
        if not team.pk:
            return "-"
        lines = teams_usage(teams=[team])[team.pk]
        cells = ((title, usage_bar(lines, field)) for field, title in BARS)
        return format_html(
            '<div class="grid gap-3 md:grid-cols-5">{}</div>',
            format_html_join("", '<div class="flex flex-col gap-1"><span>{}</span>{}</div>', cells),
        )

    def save_model(self, request: HttpRequest, obj: Team, form: forms.ModelForm, change: bool) -> None:
        """Save the team; a change of `allow_pickled_models` (builds may then run code from uploaded pickles) goes
        into the audit log."""
        super().save_model(request, obj, form, change)
        if change and "allow_pickled_models" in form.changed_data:
            record_audit(
                action=AuditAction.TEAM_PICKLES_CHANGED,
                team=obj,
                target=obj,
                before={"allow_pickled_models": not obj.allow_pickled_models},
                after={"allow_pickled_models": obj.allow_pickled_models},
            )

    def save_formset(self, request: HttpRequest, form, formset, change: bool) -> None:
        """Limits and members are saved through the tenancy services (the API's rules), not written directly."""
        team = form.instance
        if formset.model is TeamQuota:
            formset.save(commit=False)  # records what changed, for the change message; writes nothing
            for quota_form in formset.forms:
                if quota_form.has_changed() and quota_form.limits():
                    change_team_quota(user=request.user, slug=team.slug, limits=quota_form.limits())
        elif formset.model is Membership:
            formset.save(commit=False)
            for membership in formset.deleted_objects:
                remove_membership(team=team, user=membership.user)
            for membership in [*formset.new_objects, *(obj for obj, _ in formset.changed_objects)]:
                ensure_membership(team=team, user=membership.user, role=membership.role)
        else:
            super().save_formset(request, form, formset, change)


# --- API tokens ----------------------------------------------------------------------


class ApiTokenRateForm(forms.ModelForm):
    """The one field of a token staff may change: its gateway rate limit (empty: the default)."""

    requests_per_minute = forms.IntegerField(
        required=False,
        min_value=1,
        widget=_NUMBER,
        help_text="Inference gateway requests per minute; empty: CONCH_GATEWAY_REQUESTS_PER_MINUTE.",
    )

    class Meta:
        model = ApiToken
        fields = ["requests_per_minute"]


@admin.register(ApiToken)
class ApiTokenAdmin(ModelAdmin):
    """API tokens, read-only but for their inference gateway rate limit (they are created with the API or
    `manage.py create_token`); the hash is never shown. "Revoke selected tokens" revokes through
    `tenancy.services.revoke_api_token`; it needs the permission to change tokens."""

    list_display = ["prefix", "name", "user", "team", "scopes", "expires_at", "last_used_at", "is_revoked"]
    list_filter = ["is_revoked", "team"]
    list_select_related = ["user", "team"]
    search_fields = ["prefix", "name", "user__username", "team__slug"]
    fields = ["prefix", "name", "user", "team", "scopes", "deployments", "created_at", "expires_at", "last_used_at"]
    fields += ["is_revoked", "requests_per_minute"]
    # Only the gateway rate limit is edited here (through `set_token_rate_limit`); the rest is the API's.
    readonly_fields = [field for field in fields if field != "requests_per_minute"]
    form = ApiTokenRateForm
    actions = ["revoke_tokens"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: ApiToken, form: forms.ModelForm, change: bool) -> None:
        set_token_rate_limit(token_id=obj.pk, requests_per_minute=form.cleaned_data.get("requests_per_minute"))

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("tenancy.change_apitoken")

    @admin.action(description="Revoke selected tokens", permissions=["revoke"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked, skipped = [], []
        for token in queryset.order_by("pk"):
            try:
                revoke_api_token(user=request.user, token_id=token.pk)
            except ConchError:
                skipped.append(f"{token.prefix}…")
            else:
                revoked.append(f"{token.prefix}…")
        if revoked:
            self.message_user(request, f"Revoked {len(revoked)} token(s): {', '.join(revoked)}.", messages.SUCCESS)
        if skipped:
            self.message_user(request, f"Already revoked: {', '.join(skipped)}.", messages.WARNING)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyModelAdmin):
    """The audit log of every team, for staff: read-only (no add, change or delete, no actions)."""

    list_display = ["created_at", "team_slug", "actor", "token_prefix", "source", "action", "object_repr", "ip"]
    list_filter = ["action", "source", "object_type", "team"]
    search_fields = ["actor", "token_prefix", "object_repr", "object_id", "team_slug", "ip"]
    date_hierarchy = "created_at"
    actions = None

    def has_view_permission(self, request: HttpRequest, obj: AuditEntry | None = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)
