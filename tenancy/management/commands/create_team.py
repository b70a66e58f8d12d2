"""`manage.py create_team <slug> [--member USER ...] [--viewer USER ...] [--admin USER ...]`: create a team (or add
members to it, or change their roles)."""

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from tenancy.audit import AuditedCommand
from tenancy.choices import Role
from tenancy.models import Team
from tenancy.services import ensure_membership, ensure_team


class Command(AuditedCommand):
    help = "Create a team if missing and add members to it."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--member", action="append", default=[], help="Username to add as developer (repeatable).")
        parser.add_argument("--viewer", action="append", default=[], help="Username to add as viewer (read only).")
        parser.add_argument("--admin", action="append", default=[], help="Username to add as team admin.")

    def handle(self, *args, slug: str, name: str, member: list[str], viewer: list[str], admin: list[str], **options):
        created = not Team.objects.filter(slug=slug).exists()
        team = ensure_team(slug=slug, name=name)
        users = get_user_model().objects
        roles = [(u, Role.DEVELOPER) for u in member] + [(u, Role.VIEWER) for u in viewer]
        for username, role in roles + [(u, Role.ADMIN) for u in admin]:
            user = users.filter(username=username).first()
            if user is None:
                raise CommandError(f"No user '{username}'.")
            ensure_membership(team=team, user=user, role=role)
        self.stdout.write(f"team {team.slug} {'created' if created else 'exists'}")
