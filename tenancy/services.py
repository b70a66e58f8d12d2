"""Team, membership and token rules. Other apps scope every query through these functions."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from conch.errors import Conflict, InvalidInput, NotFound
from tenancy.choices import Role
from tenancy.models import ApiToken, Membership, Team

TOKEN_PREFIX = "conch_"


def _hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def create_team(*, slug: str, name: str = "") -> Team:
    """Create a team. Raises Conflict if the slug is taken."""
    if Team.objects.filter(slug=slug).exists():
        raise Conflict(f"A team with slug '{slug}' already exists.", field="slug")
    return Team.objects.create(slug=slug, name=name or slug)


def ensure_team(*, slug: str, name: str = "") -> Team:
    """Return the team `slug`, creating it if missing (idempotent)."""
    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return team


def ensure_membership(*, team: Team, user: AbstractBaseUser, role: str = Role.MEMBER) -> Membership:
    """Make `user` a member of `team` with `role` (idempotent; updates the role)."""
    membership, _ = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return membership


def create_api_token(*, user: AbstractBaseUser, name: str = "") -> str:
    """Create a bearer token for `user` and return its secret; only its sha256 is stored."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, name=name, prefix=raw[: len(TOKEN_PREFIX) + 6], key_hash=_hash_token(raw))
    return raw


def authenticate_token(*, raw: str) -> AbstractBaseUser | None:
    """Return the active user a token secret belongs to, or None for an unknown/revoked one."""
    token = ApiToken.objects.select_related("user").filter(key_hash=_hash_token(raw), is_revoked=False).first()
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


def teams_for_user(*, user: AbstractBaseUser) -> QuerySet[Team]:
    """The teams `user` belongs to (all teams for a superuser)."""
    if getattr(user, "is_superuser", False):
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user)


def get_team_for_user(*, user: AbstractBaseUser, slug: str, field: str = "team") -> Team:
    """Return the team `slug` if `user` may act in it.

    Raises InvalidInput (field `team`) when the slug is empty, NotFound when the team does
    not exist or the user is not a member (the two look the same, so team names don't leak).
    """
    if not slug:
        raise InvalidInput("Give the slug of one of your teams.", field=field)
    team = teams_for_user(user=user).filter(slug=slug).first()
    if team is None:
        raise NotFound(f"Team '{slug}' does not exist or you are not a member of it.", field=field)
    return team


@transaction.atomic
def ensure_user(*, username: str, password: str | None = None, is_superuser: bool = False) -> AbstractBaseUser:
    """Create the user if missing; set the password when given."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=username)
    if is_superuser:
        user.is_superuser = True
        user.is_staff = True
    if password is not None:
        user.set_password(password)
    user.save()
    return user
