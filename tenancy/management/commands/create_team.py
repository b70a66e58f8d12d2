"""`manage.py create_team <slug> [--member USER ...]`: create a team (or add members to it)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from tenancy.choices import Role
from tenancy.models import Team
from tenancy.services import ensure_membership


class Command(BaseCommand):
    help = "Create a team if missing and add members to it."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--member", action="append", default=[], help="Username to add (repeatable).")
        parser.add_argument("--admin", action="append", default=[], help="Username to add as team admin.")

    def handle(self, *args, slug: str, name: str, member: list[str], admin: list[str], **options):
        team, created = Team.objects.get_or_create(slug=slug, defaults={"name": name or slug})
        users = get_user_model().objects
        for username, role in [(u, Role.MEMBER) for u in member] + [(u, Role.ADMIN) for u in admin]:
            user = users.filter(username=username).first()
            if user is None:
                raise CommandError(f"No user '{username}'.")
            ensure_membership(team=team, user=user, role=role)
        self.stdout.write(f"team {team.slug} {'created' if created else 'exists'}")
