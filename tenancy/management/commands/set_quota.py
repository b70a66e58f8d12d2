"""`manage.py set_quota TEAM [--gpus N] [--instances N] [--storage-bytes N] [--models N] [--deployments N]`."""

import argparse

from django.core.management.base import CommandError

from conch.errors import ConchError
from tenancy.audit import AuditedCommand
from tenancy.quotas import get_team_for_staff, set_quota, team_usage

#: Command-line option -> quota field.
OPTIONS = {
    "gpus": "gpu",
    "instances": "instances",
    "storage_bytes": "storage_bytes",
    "models": "models",
    "deployments": "deployments",
}


def _limit(raw: str) -> int | None:
    return None if raw == "default" else int(raw)


class Command(AuditedCommand):
    help = "Set a team's quota limits ('default' puts one back to the installation's default); prints its usage."

    def add_arguments(self, parser):
        parser.add_argument("team", help="The team's slug.")
        for option in OPTIONS:
            # SUPPRESS: an option not given is absent, so it is left as it is.
            parser.add_argument(
                f"--{option.replace('_', '-')}", type=_limit, metavar="N|default", default=argparse.SUPPRESS
            )

    def handle(self, *args, team: str, **options):
        given = {field: options[option] for option, field in OPTIONS.items() if option in options}
        try:
            found = get_team_for_staff(slug=team)
            lines = set_quota(team=found, limits=given) if given else team_usage(team=found)
        except ConchError as exc:
            raise CommandError(exc.detail) from None
        for line in lines:
            default = " (default)" if line.is_default else ""
            self.stdout.write(f"{line.field:<14} {line.unit:<24} used {line.used} of {line.limit}{default}")
