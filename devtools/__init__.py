"""Development tooling, not part of the product: the one-machine demo (`manage.py run_demo`: its process supervisor
and its S3 server) and the local Kubernetes test cluster (`devtools.cluster`: `make cluster`, the `kube` tests'
fixture, bench/reconcile.py). Installed as a Django app in development only (`CONCH_ENV=development`), so a
production installation has no `run_demo` command. No app imports it."""
