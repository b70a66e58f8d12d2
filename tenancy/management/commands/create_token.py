"""`manage.py create_token <username>`: print a new API token as the last line."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from tenancy.services import create_api_token


class Command(BaseCommand):
    help = "Create an API bearer token for a user; the token is the last line printed."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="A label for the token.")

    def handle(self, *args, username: str, name: str, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user '{username}'; create one first (manage.py createsuperuser).")
        token = create_api_token(user=user, name=name)
        self.stdout.write(f"Token for {username} (shown once; only its hash is stored):")
        self.stdout.write(token)
