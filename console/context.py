"""Which team the console shows: the teams a signed-in user may see and the one chosen (kept in the session)."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest

from tenancy import services as tenancy
from tenancy.choices import Role

#: Session key holding the slug of the team the console shows.
SESSION_TEAM = "console_team"


def role_can_write(role: Role | None) -> bool:
    """Whether `role` (None: not in the team) is developer or stronger: deploy, scale, stop, upload, delete, send
    test inferences. What the console offers; the services check the role again on every write."""
    return role is not None and role.rank >= Role.DEVELOPER.rank


@dataclass(frozen=True)
class TeamContext:
    """The teams the user sees (slug order), the current one (None: the user is in no team) and their role in it
    (a `Role`, None without a team)."""

    teams: list
    team: object | None
    role: object | None

    @property
    def can_write(self) -> bool:
        """Whether the role is developer or stronger (`role_can_write`)."""
        return role_can_write(self.role)

    @property
    def is_admin(self) -> bool:
        """Whether the role is admin (members and roles)."""
        return self.role is not None and self.role == Role.ADMIN


def team_context(request: HttpRequest) -> TeamContext:
    """The current team of a signed-in request: the session's choice when still one of the user's teams, else the
    first of them by slug. Worked out once per request (views and the context processor share it)."""
    cached = getattr(request, "_console_team", None)
    if cached is not None:
        return cached
    teams = list(tenancy.teams_for_user(user=request.user).order_by("slug"))
    chosen = request.session.get(SESSION_TEAM)
    team = next((t for t in teams if t.slug == chosen), teams[0] if teams else None)
    role = tenancy.role_in_team(user=request.user, team=team) if team is not None else None
    request._console_team = TeamContext(teams=teams, team=team, role=role)
    return request._console_team


def console(request: HttpRequest) -> dict:
    """Template context processor: `console` (a TeamContext) on every page of a signed-in user."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    return {"console": team_context(request)}
