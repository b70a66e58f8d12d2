"""Team, membership, role and token rules. Other apps scope every query and check every write through these.

Who may do what: a member's role in a team (`Role`: viewer < developer < admin; staff users are platform
admins, admin in every team) and, for a request made with an API token, the token (`TokenGrant`: its team,
scopes and deployment names). Services of every app take the caller as `user=` plus `token=` (None for a
console session or a management command) and call `teams_for_user` to scope reads and `require_role` before
each write.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from conch.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthenticated
from tenancy.audit import record_audit
from tenancy.choices import AuditAction, Role, Scope
from tenancy.models import ApiToken, AuditEntry, Membership, Team

TOKEN_PREFIX = "conch_"
#: Characters of the secret after TOKEN_PREFIX kept as the token's visible prefix.
PREFIX_CHARS = 6
#: Longest deployment name a token may be limited to (a deployment name is a DNS label).
MAX_NAME_LENGTH = 63


@dataclass(frozen=True)
class TokenGrant:
    """What the API token of a request allows (DRF's `request.auth`; None for a console session).

    `team_id` None: a token made before tokens were bound to teams, acting in all of its user's teams.
    `deployments` empty: any deployment of the team.
    """

    id: int
    prefix: str
    team_id: int | None
    scopes: frozenset[str]
    deployments: tuple[str, ...]
    expires_at: datetime
    #: The token's own inference gateway limit in requests per minute; None: the default setting.
    requests_per_minute: int | None = None

    @classmethod
    def of(cls, token: ApiToken) -> TokenGrant:
        return cls(
            id=token.pk,
            prefix=token.prefix,
            team_id=token.team_id,
            scopes=frozenset(token.scopes),
            deployments=tuple(token.deployments),
            expires_at=token.expires_at,
            requests_per_minute=token.requests_per_minute,
        )


@dataclass(frozen=True)
class IssuedToken:
    """A token just created: its row and its secret, which is shown this once and never stored."""

    token: ApiToken
    secret: str


def _hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def create_team(*, slug: str, name: str = "") -> Team:
    """Create a team. Raises Conflict if the slug is taken."""
    if Team.objects.filter(slug=slug).exists():
        raise Conflict(f"A team with slug '{slug}' already exists.", field="slug")
    team = Team.objects.create(slug=slug, name=name or slug)
    record_audit(action=AuditAction.TEAM_CREATED, team=team, target=team, after={"name": team.name})
    return team


def ensure_team(*, slug: str, name: str = "") -> Team:
    """Return the team `slug`, creating it if missing (idempotent)."""
    team, created = Team.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    if created:
        record_audit(action=AuditAction.TEAM_CREATED, team=team, target=team, after={"name": team.name})
    return team


def ensure_membership(*, team: Team, user: User, role: str = Role.DEVELOPER) -> Membership:
    """Make `user` a member of `team` with `role` (idempotent; updates the role). A change is audited."""
    with transaction.atomic():
        held = Membership.objects.select_for_update().filter(team=team, user=user)
        previous = held.values_list("role", flat=True).first()
        membership, _ = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
        if previous != membership.role:
            record_audit(
                action=AuditAction.MEMBERSHIP_CHANGED,
                team=team,
                target=membership,
                before={"role": previous},
                after={"role": membership.role},
            )
    return membership


def remove_membership(*, team: Team, user: User) -> bool:
    """Take `user` out of `team` (idempotent); returns whether they were a member. Their tokens of the team stop
    working with it (a token acts with its user's role in its team, and they have none)."""
    deleted, _ = Membership.objects.filter(team=team, user=user).delete()
    return bool(deleted)


def is_platform_admin(user: User) -> bool:
    """Staff users (and superusers) administer every team."""
    return bool(getattr(user, "is_staff", False) or getattr(user, "is_superuser", False))


def role_in_team(*, user: User, team: Team) -> Role | None:
    """The user's role in `team` (admin for a platform admin), or None for a non-member."""
    if is_platform_admin(user):
        return Role.ADMIN
    role = Membership.objects.filter(team=team, user=user).values_list("role", flat=True).first()
    return Role(role) if role else None


def teams_for_user(*, user: User, token: TokenGrant | None = None) -> QuerySet[Team]:
    """The teams `user` may see (all teams for a platform admin); only the token's team with a bound token."""
    teams = Team.objects.all() if is_platform_admin(user) else Team.objects.filter(memberships__user=user)
    if token is not None and token.team_id is not None:
        teams = teams.filter(pk=token.team_id)
    return teams


def get_team_for_user(*, user: User, slug: str, field: str = "team", token: TokenGrant | None = None) -> Team:
    """Return the team `slug` if `user` (and `token`) may act in it.

    Raises InvalidInput (field `team`) when the slug is empty, NotFound when the team does
    not exist or the user is not a member (the two look the same, so team names don't leak).
    """
    if not slug:
        raise InvalidInput("Give the slug of one of your teams.", field=field)
    team = teams_for_user(user=user, token=token).filter(slug=slug).first()
    if team is None:
        raise NotFound(f"Team '{slug}' does not exist or you are not a member of it.", field=field)
    return team


def require_role(
    *,
    user: User,
    team: Team,
    role: Role,
    action: str,
    token: TokenGrant | None = None,
    scope: Scope | None = None,
    deployment_name: str | None = None,
) -> None:
    """Check that the caller may do `action` in `team`; every write of every app calls this first.

    `action` starts the error sentences ("Creating a deployment"). With a token: the token must be of `team`
    (else NotFound, as for any object of another team), carry `scope`, and, when it is limited to named
    deployments, name `deployment_name`. Then the user's role in `team` must be `role` or stronger. Raises
    Forbidden (403) naming the scope or the role needed and the one the caller has; NotFound for a non-member.
    """
    if token is not None:
        if token.team_id is not None and token.team_id != team.pk:
            raise NotFound(f"Team '{team.slug}' does not exist or you are not a member of it.", field="team")
        if scope is not None:
            require_scope(token=token, scope=scope, action=action)
        if deployment_name is not None and token.deployments and deployment_name not in token.deployments:
            raise Forbidden(
                f"{action} on deployment '{deployment_name}' is outside token {token.prefix}…, which is limited "
                f"to deployments {', '.join(token.deployments)}.",
            )
    current = role_in_team(user=user, team=team)
    if current is None:
        raise NotFound(f"Team '{team.slug}' does not exist or you are not a member of it.", field="team")
    if current.rank < role.rank:
        raise Forbidden(f"{action} needs the {role.value} role in team '{team.slug}'; you are a {current.value}.")


def require_scope(*, token: TokenGrant | None, scope: Scope, action: str) -> None:
    """Check that a token request carries `scope` (a session, `token` None, has every scope). Raises Forbidden."""
    if token is not None and scope not in token.scopes:
        held = ", ".join(sorted(token.scopes)) or "none"
        raise Forbidden(
            f"{action} needs a token with the '{scope}' scope; token {token.prefix}… has {held}. "
            f"Create a token with that scope."
        )


# --- API tokens -------------------------------------------------------------------


#: The scopes a role can use: a viewer only reads (every write and inference needs the developer role).
ROLE_SCOPES: dict[Role, tuple[str, ...]] = {
    Role.VIEWER: (Scope.READ,),
    Role.DEVELOPER: tuple(Scope.values),
    Role.ADMIN: tuple(Scope.values),
}


def scopes_for_role(role: Role) -> list[str]:
    """The scopes a token of a member with `role` gets by default, and the most it may have (ROLE_SCOPES)."""
    return list(ROLE_SCOPES[role])


def _parse_scopes(scopes: Iterable[str] | None, *, role: Role) -> list[str]:
    usable = scopes_for_role(role)
    if scopes is None:
        return usable
    if isinstance(scopes, str) or not isinstance(scopes, Iterable):
        raise InvalidInput(f"scopes must be a list of {', '.join(Scope.values)}.", field="scopes")
    chosen = []
    for scope in scopes:
        if scope not in Scope.values:
            raise InvalidInput(f"Unknown scope {scope!r}; choose from {', '.join(Scope.values)}.", field="scopes")
        if scope not in chosen:
            chosen.append(scope)
    if not chosen:
        raise InvalidInput(f"Give at least one scope of {', '.join(Scope.values)}.", field="scopes")
    unusable = [scope for scope in chosen if scope not in usable]
    if unusable:
        raise Forbidden(
            f"A {role.value} cannot use the scope{'s' if len(unusable) > 1 else ''} {', '.join(unusable)}; a "
            f"{role.value}'s token may have {', '.join(usable)}. Leave {', '.join(unusable)} out, or ask a team "
            "admin for the developer role.",
            field="scopes",
        )
    return chosen


def _parse_deployments(deployments: Iterable[str] | None) -> list[str]:
    if deployments is None:
        return []
    if isinstance(deployments, str) or not isinstance(deployments, Iterable):
        raise InvalidInput("deployments must be a list of deployment names.", field="deployments")
    names = []
    for name in deployments:
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
            raise InvalidInput(
                f"deployments must name deployments (1 to {MAX_NAME_LENGTH} characters each).", field="deployments"
            )
        if name not in names:
            names.append(name)
    return names


def _expiry(expires_in_days: object) -> datetime:
    most = settings.CONCH_TOKEN_MAX_DAYS
    if expires_in_days is None:
        return timezone.now() + timedelta(days=min(settings.CONCH_TOKEN_DEFAULT_DAYS, most))
    if isinstance(expires_in_days, bool) or not isinstance(expires_in_days, int) or not 1 <= expires_in_days <= most:
        raise InvalidInput(
            f"expires_in_days must be a whole number of days from 1 to {most} (CONCH_TOKEN_MAX_DAYS).",
            field="expires_in_days",
        )
    return timezone.now() + timedelta(days=expires_in_days)


def create_api_token(
    *,
    user: User,
    team: Team | None,
    name: str = "",
    scopes: Iterable[str] | None = None,
    deployments: Iterable[str] | None = None,
    expires_in_days: int | None = None,
    token: TokenGrant | None = None,
) -> IssuedToken:
    """Create a bearer token of `user` in `team` and return it with its secret; only its sha256 is stored.

    `scopes` None: every scope the user's role in `team` can use (`scopes_for_role`: a viewer's token only
    reads). `deployments`: names the token is limited to (None or empty: any). Expires
    after `expires_in_days` (default CONCH_TOKEN_DEFAULT_DAYS, at most CONCH_TOKEN_MAX_DAYS). `token`: the
    token the request creating this one was made with; the new one then stays inside it (same team, no
    scope it lacks, no later expiry, no other deployments). Raises InvalidInput naming the field, NotFound
    for a team the user is not in, Forbidden (field `scopes`) for a scope the role cannot use, Forbidden for more
    than the creating token has.
    """
    if team is None:
        raise InvalidInput("Give the team the token acts in.", field="team")
    role = role_in_team(user=user, team=team)
    if role is None:
        raise NotFound(f"Team '{team.slug}' does not exist or you are not a member of it.", field="team")
    chosen_scopes = _parse_scopes(scopes, role=role)
    names = _parse_deployments(deployments)
    expires_at = _expiry(expires_in_days)
    if token is not None:
        if token.team_id is not None and token.team_id != team.pk:
            raise NotFound(f"Team '{team.slug}' does not exist or you are not a member of it.", field="team")
        for scope in chosen_scopes:
            require_scope(token=token, scope=Scope(scope), action="Creating a token with it")
        if token.deployments and not (names and set(names) <= set(token.deployments)):
            raise Forbidden(
                f"Token {token.prefix}… is limited to deployments {', '.join(token.deployments)}; a token it "
                "creates must be limited to some of them.",
                field="deployments",
            )
        expires_at = min(expires_at, token.expires_at)
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(
        user=user,
        team=team,
        name=name[:100],
        prefix=raw[: len(TOKEN_PREFIX) + PREFIX_CHARS],
        key_hash=_hash_token(raw),
        scopes=chosen_scopes,
        deployments=names,
        expires_at=expires_at,
    )
    record_audit(
        action=AuditAction.TOKEN_CREATED,
        team=team,
        target=row,
        after={"name": row.name, "scopes": chosen_scopes, "deployments": names, "expires_at": expires_at},
    )
    return IssuedToken(token=row, secret=raw)


def authenticate_token(*, raw: str) -> tuple[User, TokenGrant]:
    """Return the active user a token secret belongs to, and what the token allows.

    Raises Unauthenticated for an unknown token (or one of an inactive user), a revoked one, or an expired
    one, saying which and that a new one is needed.
    """
    token = ApiToken.objects.select_related("user").filter(key_hash=_hash_token(raw)).first()
    if token is None:
        raise Unauthenticated(
            "Unknown or revoked token; create a new one on your team's page in the console or with "
            "POST /api/v1/tokens/ (signed in), and send it as 'Authorization: Bearer <token>'."
        )
    if not token.user.is_active:
        raise Unauthenticated(f"token {token.prefix}… belongs to a deactivated user; ask an admin to reactivate it")
    if token.is_revoked:
        raise Unauthenticated(f"token {token.prefix}… was revoked; create a new one")
    now = timezone.now()
    if token.expires_at <= now:
        raise Unauthenticated(f"token {token.prefix}… expired on {token.expires_at:%Y-%m-%d}; create a new one")
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user, TokenGrant.of(token)


def set_token_rate_limit(*, token_id: int, requests_per_minute: int | None) -> ApiToken:
    """Give token `token_id` its own inference gateway limit in requests per minute (None: back to
    CONCH_GATEWAY_REQUESTS_PER_MINUTE). For staff (the admin). Raises NotFound, InvalidInput (field
    `requests_per_minute`) for a value under 1."""
    if requests_per_minute is not None and requests_per_minute < 1:
        raise InvalidInput(
            "requests_per_minute must be 1 or more (empty: the default); revoke the token to stop it.",
            field="requests_per_minute",
        )
    with transaction.atomic():
        token = ApiToken.objects.select_for_update(of=("self",)).select_related("team").filter(pk=token_id).first()
        if token is None:
            raise NotFound(f"Token {token_id} does not exist.")
        before = token.requests_per_minute
        if before != requests_per_minute:
            token.requests_per_minute = requests_per_minute
            token.save(update_fields=["requests_per_minute"])
            record_audit(
                action=AuditAction.TOKEN_RATE_LIMIT_CHANGED,
                team=token.team,
                target=token,
                before={"requests_per_minute": before},
                after={"requests_per_minute": requests_per_minute},
            )
    return token


def visible_tokens(*, user: User, token: TokenGrant | None = None) -> QuerySet[ApiToken]:
    """Tokens the caller may list and revoke: their own, and every token of the teams they administer.

    Revoked tokens are left out. With a team-bound `token`, only tokens of its team.
    """
    tokens = ApiToken.objects.filter(is_revoked=False).select_related("team", "user")
    if not is_platform_admin(user):
        administered = Membership.objects.filter(user=user, role=Role.ADMIN).values("team_id")
        tokens = tokens.filter(Q(user=user) | Q(team_id__in=administered))
    if token is not None and token.team_id is not None:
        tokens = tokens.filter(team_id=token.team_id)
    return tokens


def revoke_api_token(*, user: User, token_id: int, token: TokenGrant | None = None) -> ApiToken:
    """Revoke a token the caller may manage (`visible_tokens`); it answers 401 from then on. Raises NotFound."""
    row = visible_tokens(user=user, token=token).filter(pk=token_id).first()
    if row is None:
        raise NotFound(f"Token {token_id} does not exist or is not one you may manage.")
    ApiToken.objects.filter(pk=row.pk).update(is_revoked=True)
    row.is_revoked = True
    record_audit(action=AuditAction.TOKEN_REVOKED, team=row.team, target=row, before={"is_revoked": False})
    return row


def revoke_named_tokens(*, user: User, name: str) -> int:
    """Revoke every token of `user` called `name` (a tool replacing its token); returns how many."""
    rows = list(ApiToken.objects.filter(user=user, name=name, is_revoked=False).select_related("team", "user"))
    ApiToken.objects.filter(pk__in=[row.pk for row in rows]).update(is_revoked=True)
    for row in rows:
        record_audit(action=AuditAction.TOKEN_REVOKED, team=row.team, target=row, before={"is_revoked": False})
    return len(rows)


@transaction.atomic
def ensure_user(*, username: str, password: str | None = None, is_superuser: bool = False) -> User:
    """Create the user if missing; set the password when given. Audited: its creation, a new password, and
    becoming staff."""
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=username)
    promoted = is_superuser and not (user.is_superuser and user.is_staff)
    if is_superuser:
        user.is_superuser = True
        user.is_staff = True
    if password is not None:
        user.set_password(password)
    elif created:
        user.set_unusable_password()  # no sign-in until a password is set (manage.py changepassword)
    user.save()
    changes = {"password_set": password is not None, "is_superuser": user.is_superuser}
    if created:
        record_audit(action=AuditAction.USER_CREATED, team=None, target=user, after=changes)
    elif promoted or password is not None:
        record_audit(action=AuditAction.USER_CHANGED, team=None, target=user, after=changes)
    return user


def change_team_quota(*, user: User, slug: str, limits: Mapping[str, Any], token: TokenGrant | None = None) -> list:
    """Set some of team `slug`'s limits as a platform admin (`tenancy.quotas.set_quota`); returns its usage.

    Only staff may: Forbidden otherwise. Through an API token, the token must be of that team (NotFound
    otherwise, as for any object of another team), carry both write scopes and not be limited to named
    deployments (a quota is team-wide): Forbidden naming what is missing. NotFound (field `slug`) for an unknown
    team; InvalidInput naming the field for a bad limit.
    """
    from tenancy.quotas import get_team_for_staff, set_quota

    action = "Setting a team's quota"
    if not is_platform_admin(user):
        raise Forbidden(f"{action} needs a platform admin (a staff user); team admins can read it at …/usage.")
    team = get_team_for_staff(slug=slug)
    if token is not None:
        if token.team_id is not None and token.team_id != team.pk:
            raise NotFound(f"Team '{slug}' does not exist or this token is not of it.", field="slug")
        for scope in (Scope.MODELS_WRITE, Scope.DEPLOYMENTS_WRITE):
            require_scope(token=token, scope=scope, action=action)
        if token.deployments:
            raise Forbidden(
                f"{action} is team-wide; token {token.prefix}… is limited to deployments "
                f"{', '.join(token.deployments)}. Use a token of the whole team, or the admin."
            )
    return set_quota(team=team, limits=limits)


# --- audit log ----------------------------------------------------------------------


def object_history(*, team: Team, object_type: str, object_id: object, limit: int = 50) -> list[AuditEntry]:
    """The audit entries of one object of `team` (`object_type` as `record_audit` names it: "deployment",
    "model", "version", …), newest first, at most `limit`.

    For a page that shows an object's history to the members who may see the object: the caller checks that
    first (this reads no caller). The team's whole log stays for its admins (`visible_audit_entries`).
    """
    entries = AuditEntry.objects.filter(team=team, object_type=object_type, object_id=str(object_id))
    return list(entries.order_by("-created_at", "-id")[:limit])


def visible_audit_entries(*, user: User, token: TokenGrant | None = None, team_slug: str = "") -> QuerySet[AuditEntry]:
    """Audit entries the caller may read, newest first: those of the teams they administer (every entry, the
    ones of no team included, for a platform admin; only its team's with a team-bound `token`).

    `team_slug`: only that team's. Raises NotFound (field `team`) for a team the caller is not in, Forbidden
    naming the admin role for a member who is not a team admin (or not of any team, without `team_slug`).
    """
    action = "Reading the audit log"
    if not team_slug and token is not None and token.team_id is not None:
        team_slug = Team.objects.filter(pk=token.team_id).values_list("slug", flat=True).first() or ""
    if team_slug:
        team = get_team_for_user(user=user, slug=team_slug, token=token)
        require_role(user=user, team=team, role=Role.ADMIN, action=action, token=token)
        return AuditEntry.objects.filter(team=team)
    if is_platform_admin(user):
        return AuditEntry.objects.all()
    memberships = Membership.objects.filter(user=user).values_list("team_id", "team__slug", "role")
    administered = [team_id for team_id, _, role in memberships if role == Role.ADMIN]
    if not administered:
        held = ", ".join(f"a {role} in '{slug}'" for _, slug, role in sorted(memberships, key=lambda m: m[1]))
        raise Forbidden(f"{action} needs the admin role in a team; you are {held or 'in no team'}.")
    return AuditEntry.objects.filter(team_id__in=administered)
