"""Development tooling, not part of the product: the one-machine demo (`manage.py run_demo`: its process supervisor
and its S3 server). Installed as a Django app in development only (`CONCH_ENV=development`), so a production
installation has no `run_demo` command. No app imports it."""
