"""`manage.py worker_health`: exit 0 when a Celery worker is taking tasks, 1 when it is not (a liveness probe).

Each run sends one heartbeat task to the worker's own queue and judges the worker by the last heartbeat
it ran (conch.liveness): a worker that ran none within `--max-age` seconds while one of its pool
processes sat idle is stuck, even if `celery inspect ping` still answers. Run it in the worker's own
container or host, more often than `--max-age` (docker-compose.yml's worker healthcheck does).
"""

from __future__ import annotations

import logging

from celery.utils.nodenames import default_nodename
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from kombu.exceptions import KombuError

from conch.liveness import send_worker_heartbeat, worker_liveness


class Command(BaseCommand):
    help = "Liveness probe of a Celery worker: exit 1 when it ran no heartbeat task recently."

    def add_arguments(self, parser):
        parser.add_argument(
            "--node", default=default_nodename(None), help="The worker's node name (-n); default celery@<this host>."
        )
        parser.add_argument(
            "--max-age",
            type=float,
            default=settings.CONCH_WORKER_HEARTBEAT_MAX_AGE_SECONDS,
            help="Seconds a worker may go without running a heartbeat (CONCH_WORKER_HEARTBEAT_MAX_AGE_SECONDS).",
        )
        parser.add_argument("--no-send", action="store_true", help="Only judge; send no new heartbeat.")

    def handle(self, *args, node: str, max_age: float, no_send: bool, **options):
        # kombu warns "No hostname was supplied" on every filesystem:// connection; that broker needs none.
        logging.getLogger("kombu.connection").setLevel(logging.ERROR)
        if not no_send:
            try:
                send_worker_heartbeat(node=node, expires_s=max_age)
            except (KombuError, OSError) as exc:
                raise CommandError(f"worker {node}: cannot send a heartbeat through the broker: {exc}") from exc
        liveness = worker_liveness(node=node, max_age_s=max_age)
        if not liveness.alive:
            raise CommandError(f"worker {node} {liveness.reason}")
        self.stdout.write(f"worker {node} {liveness.reason}")
