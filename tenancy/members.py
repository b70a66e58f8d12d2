"""Team members and their roles, managed by the team's admins (and staff): list, add, change a role, remove.

A team always keeps at least one admin: demoting or removing the last one is refused (409), under a lock on the
team's row so two admins demoting each other at once cannot both succeed. Through an API token, managing members
is team-wide: the token must be of the team, carry both write scopes and not be limited to named deployments.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from conch.errors import Conflict, Forbidden, InvalidInput, NotFound
from tenancy.audit import record_audit
from tenancy.choices import AuditAction, Role, Scope
from tenancy.models import ApiToken, Membership, Team
from tenancy.services import TokenGrant, get_team_for_user, require_role, require_scope


def list_members(*, user: AbstractBaseUser, slug: str, token: TokenGrant | None = None) -> QuerySet[Membership]:
    """Members of team `slug` with their roles, by username. Needs the admin role in it (Forbidden naming it);
    NotFound (field `slug`) for a team the caller is not in."""
    team = _team_of_admin(user=user, slug=slug, token=token, action="Listing a team's members", write=False)
    return Membership.objects.filter(team=team).select_related("user").order_by("user__username")


def add_member(
    *, user: AbstractBaseUser, slug: str, username: str, role: str, token: TokenGrant | None = None
) -> Membership:
    """Make the existing user `username` a member of team `slug` with `role`.

    Needs the admin role (Forbidden). Raises InvalidInput (field `role`) for an unknown role, NotFound (field
    `username`) for an unknown user, Conflict (field `username`) for a member already (PATCH changes a role).
    """
    team = _team_of_admin(user=user, slug=slug, token=token, action="Adding a team member")
    if not isinstance(username, str) or not username.strip():
        raise InvalidInput("username: give the username of an existing user.", field="username")
    chosen = _parse_role(role)
    member = get_user_model().objects.filter(username=username).first()
    if member is None:
        raise NotFound(f"User '{username}' does not exist; they must sign up (or be created) first.", field="username")
    try:
        with transaction.atomic():
            membership = Membership.objects.create(team=team, user=member, role=chosen)
            record_audit(
                action=AuditAction.MEMBERSHIP_CHANGED, team=team, target=membership, after={"role": chosen.value}
            )
            return membership
    except IntegrityError:
        current = Membership.objects.get(team=team, user=member).role
        raise Conflict(
            f"'{username}' is already a {current} of team '{team.slug}'; change the role with PATCH "
            f"/api/v1/teams/{team.slug}/members/{username}/.",
            field="username",
        ) from None


def change_member_role(
    *, user: AbstractBaseUser, slug: str, username: str, role: str, token: TokenGrant | None = None
) -> Membership:
    """Give member `username` of team `slug` the role `role`.

    Needs the admin role (Forbidden). Raises InvalidInput (field `role`), NotFound (field `username`) for a
    non-member, Conflict (field `role`) when it would leave the team without an admin.
    """
    team = _team_of_admin(user=user, slug=slug, token=token, action="Changing a member's role")
    chosen = _parse_role(role)
    with transaction.atomic():
        membership = _locked_membership(team, username)
        if membership.role == Role.ADMIN and chosen != Role.ADMIN:
            _keep_an_admin(team, username, field="role")
        before = membership.role
        membership.role = chosen
        membership.save(update_fields=["role"])
        if before != chosen:
            record_audit(
                action=AuditAction.MEMBERSHIP_CHANGED,
                team=team,
                target=membership,
                before={"role": before},
                after={"role": chosen.value},
            )
    return membership


def remove_member(*, user: AbstractBaseUser, slug: str, username: str, token: TokenGrant | None = None) -> None:
    """Take `username` out of team `slug` and revoke their tokens of it (they answer 401 from then on).

    Needs the admin role (Forbidden); an admin may remove themselves while another admin remains. Raises
    NotFound (field `username`) for a non-member, Conflict (field `username`) for the team's last admin.
    """
    team = _team_of_admin(user=user, slug=slug, token=token, action="Removing a team member")
    with transaction.atomic():
        membership = _locked_membership(team, username)
        if membership.role == Role.ADMIN:
            _keep_an_admin(team, username, field="username")
        record_audit(
            action=AuditAction.MEMBERSHIP_REMOVED, team=team, target=membership, before={"role": membership.role}
        )
        membership.delete()
        revoked = ApiToken.objects.filter(team=team, user=membership.user, is_revoked=False).update(is_revoked=True)
        if revoked:
            record_audit(
                action=AuditAction.TOKEN_REVOKED,
                team=team,
                object_type="token",
                object_repr=f"{revoked} token(s) of {username}",
                after={"is_revoked": True},
            )


def _team_of_admin(
    *, user: AbstractBaseUser, slug: str, token: TokenGrant | None, action: str, write: bool = True
) -> Team:
    team = get_team_for_user(user=user, slug=slug, field="slug", token=token)
    require_role(user=user, team=team, role=Role.ADMIN, action=action, token=token)
    if write and token is not None:
        for scope in (Scope.MODELS_WRITE, Scope.DEPLOYMENTS_WRITE):
            require_scope(token=token, scope=scope, action=action)
        if token.deployments:
            raise Forbidden(
                f"{action} is team-wide; token {token.prefix}… is limited to deployments "
                f"{', '.join(token.deployments)}. Use a token of the whole team."
            )
    return team


def _parse_role(role: object) -> Role:
    if role not in Role.values:
        raise InvalidInput(f"role must be one of {', '.join(Role.values)}.", field="role")
    return Role(role)


def _locked_membership(team: Team, username: str) -> Membership:
    # Every change of a team's roles takes the team's row first: the admin count below is then exact.
    Team.objects.select_for_update().filter(pk=team.pk).values_list("pk", flat=True).first()
    membership = Membership.objects.select_related("user").filter(team=team, user__username=username).first()
    if membership is None:
        raise NotFound(f"'{username}' is not a member of team '{team.slug}'.", field="username")
    return membership


def teams_left_without_admin(*, user_ids: list[int]) -> list[Team]:
    """Teams that would have no admin left if the users `user_ids` were deleted (for the admin's user delete)."""
    teams = Team.objects.filter(memberships__user_id__in=user_ids, memberships__role=Role.ADMIN).distinct()
    return [
        team
        for team in teams.order_by("slug")
        if not Membership.objects.filter(team=team, role=Role.ADMIN).exclude(user_id__in=user_ids).exists()
    ]


def _keep_an_admin(team: Team, username: str, *, field: str) -> None:
    others = Membership.objects.filter(team=team, role=Role.ADMIN).exclude(user__username=username)
    if not others.exists():
        raise Conflict(
            f"'{username}' is the last admin of team '{team.slug}'; a team must keep at least one admin. Make "
            "another member admin first.",
            field=field,
        )
