"""`manage.py create_token <username> [--team T] [--scope S ...] [--expires-in 30d]`: print a new API token last."""

import re

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from conch.errors import ConchError
from tenancy.audit import AuditedCommand
from tenancy.choices import Scope
from tenancy.services import create_api_token, get_team_for_user, teams_for_user

_DAYS = re.compile(r"([0-9]{1,6})d?")


def _days(text: str) -> int:
    match = _DAYS.fullmatch(text.strip())
    if match is None:
        raise CommandError(f"--expires-in takes a number of days such as 30d, got {text!r}.")
    return int(match.group(1))


class Command(AuditedCommand):
    help = "Create an API bearer token of a user in one team; the token is the last line printed."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="A label for the token.")
        parser.add_argument("--team", default="", help="Slug of the team it acts in (default: the user's only team).")
        parser.add_argument(
            "--scope",
            action="append",
            choices=Scope.values,
            default=None,
            help="What it may do (repeatable; default: every scope).",
        )
        parser.add_argument(
            "--deployment", action="append", default=None, help="Limit it to this deployment name (repeatable)."
        )
        parser.add_argument("--expires-in", default=None, help="Days until it expires, e.g. 30d (default 90d).")

    def handle(self, *args, username: str, name: str, team: str, scope, deployment, expires_in, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user '{username}'; create one first (manage.py createsuperuser).")
        try:
            if team:
                chosen = get_team_for_user(user=user, slug=team)
            else:
                teams = list(teams_for_user(user=user).values_list("slug", flat=True)[:21])
                if len(teams) != 1:
                    listed = ", ".join(teams[:20]) or "none; add the user to one with manage.py create_team"
                    raise CommandError(f"Give --team: a token acts in one team ({username}'s teams: {listed}).")
                chosen = get_team_for_user(user=user, slug=teams[0])
            issued = create_api_token(
                user=user,
                team=chosen,
                name=name,
                scopes=scope,
                deployments=deployment,
                expires_in_days=_days(expires_in) if expires_in else None,
            )
        except ConchError as exc:
            raise CommandError(exc.detail) from None
        row = issued.token
        limit = f", deployments {', '.join(row.deployments)}" if row.deployments else ""
        self.stdout.write(
            f"Token for {username} in team {chosen.slug}, scopes {', '.join(row.scopes)}{limit}, "
            f"expires {row.expires_at:%Y-%m-%d} (shown once; only its hash is stored):"
        )
        self.stdout.write(issued.secret)
