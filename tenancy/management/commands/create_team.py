"""`manage.py create_team <slug> [--member USER ...] [--viewer USER ...] [--admin USER ...]`: create a team (or add
members to it, or change their roles)."""

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from tenancy.audit import AuditedCommand
from tenancy.choices import Role
from tenancy.models import Team
from tenancy.services import ensure_membership, ensure_team, ensure_user


class Command(AuditedCommand):
    help = "Create a team if missing and add members to it."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--member", action="append", default=[], help="Username to add as developer (repeatable).")
        parser.add_argument("--viewer", action="append", default=[], help="Username to add as viewer (read only).")
        parser.add_argument("--admin", action="append", default=[], help="Username to add as team admin.")
        parser.add_argument(
            "--create-users",
            action="store_true",
            help="Create the users that do not exist yet (without a password: set one with manage.py changepassword).",
        )

    def handle(
        self,
        *args,
        slug: str,
        name: str,
        member: list[str],
        viewer: list[str],
        admin: list[str],
        create_users: bool,
        **options,
    ):
        users = get_user_model().objects
        roles = [(u, Role.DEVELOPER) for u in member] + [(u, Role.VIEWER) for u in viewer]
        roles += [(u, Role.ADMIN) for u in admin]
        # Every user is checked before anything is written: a typo leaves no half-made team behind.
        missing = [username for username, _ in roles if not users.filter(username=username).exists()]
        if missing and not create_users:
            raise CommandError(
                f"No user {', '.join(repr(u) for u in missing)}; create them with --create-users (then set a "
                "password with manage.py changepassword USER), or with manage.py createsuperuser for staff."
            )
        created = not Team.objects.filter(slug=slug).exists()
        team = ensure_team(slug=slug, name=name)
        for username, role in roles:
            user = users.filter(username=username).first() or ensure_user(username=username)
            ensure_membership(team=team, user=user, role=role)
        self.stdout.write(f"team {team.slug} {'created' if created else 'exists'}")
        for username in missing:
            self.stdout.write(f"user {username} created without a password: manage.py changepassword {username}")
