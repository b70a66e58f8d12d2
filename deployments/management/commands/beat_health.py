"""`manage.py beat_health`: exit 0 when Celery beat is publishing its schedule, 1 when not (a liveness probe).

Beat rewrites its record on every task it publishes, its own heartbeat entry at least every
CONCH_HEARTBEAT_INTERVAL_SECONDS (conch.liveness). Run it where beat runs.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from conch.liveness import beat_liveness


class Command(BaseCommand):
    help = "Liveness probe of Celery beat: exit 1 when it published no task recently."

    def add_arguments(self, parser):
        parser.add_argument(
            "--max-age",
            type=float,
            default=settings.CONCH_BEAT_HEARTBEAT_MAX_AGE_SECONDS,
            help="Seconds beat may go without publishing (CONCH_BEAT_HEARTBEAT_MAX_AGE_SECONDS).",
        )

    def handle(self, *args, max_age: float, **options):
        liveness = beat_liveness(max_age_s=max_age)
        if not liveness.alive:
            raise CommandError(liveness.reason)
        self.stdout.write(liveness.reason)
