"""Django settings for Conch, all read from the environment (see `.env.example`).

Embedded defaults (no variable set) run everything on one machine: SQLite under
`var/`, kombu's filesystem transport as the Celery broker, a folder as object store,
and local `tritonserver` processes. Production sets DATABASE_URL (PostgreSQL),
CELERY_BROKER_URL (Redis) and CONCH_STORAGE_URL (s3://...).

`CONCH_ENV=production` makes start-up refuse an insecure configuration (the development
SECRET_KEY or a weak one, DEBUG on, ALLOWED_HOSTS='*') and turns the HTTPS protections
on by default (secure cookies, HSTS, redirect to HTTPS), so the security checks of
`manage.py check --deploy` pass. `development` (the default) keeps the plain-HTTP demo on 127.0.0.1 working.
"""

from __future__ import annotations

import hashlib
import ipaddress
import platform
import re
import sys
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from conch.env import env, env_labels

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env("CONCH_VAR_DIR", str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

CONCH_ENV = env("CONCH_ENV", "development")
if CONCH_ENV not in {"development", "production"}:
    raise ImproperlyConfigured(f"CONCH_ENV must be 'development' or 'production', not {CONCH_ENV!r}.")
PRODUCTION = CONCH_ENV == "production"

DEVELOPMENT_SECRET_KEY = "conch-insecure-development-key-change-me"
SECRET_KEY = env("DJANGO_SECRET_KEY", DEVELOPMENT_SECRET_KEY)
DEBUG = env("DJANGO_DEBUG", False, cast=bool)
ALLOWED_HOSTS = env("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"], cast=list)
CSRF_TRUSTED_ORIGINS = env("DJANGO_CSRF_TRUSTED_ORIGINS", [], cast=list)

# HTTPS protections (Django "Deployment checklist", "HTTPS"): on by default in production, off in development,
# each overridable. HSTS is in seconds.
SECURE_SSL_REDIRECT = env("DJANGO_SECURE_SSL_REDIRECT", PRODUCTION, cast=bool)
SESSION_COOKIE_SECURE = env("DJANGO_SESSION_COOKIE_SECURE", PRODUCTION, cast=bool)
CSRF_COOKIE_SECURE = env("DJANGO_CSRF_COOKIE_SECURE", PRODUCTION, cast=bool)
SECURE_HSTS_SECONDS = env("DJANGO_SECURE_HSTS_SECONDS", 31_536_000 if PRODUCTION else 0, cast=int)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", PRODUCTION, cast=bool)
SECURE_HSTS_PRELOAD = env("DJANGO_SECURE_HSTS_PRELOAD", PRODUCTION, cast=bool)
# "X-Forwarded-Proto=https": the header (and value) a TLS-terminating proxy in front of Conch sets, so Django
# knows the request came over HTTPS. Only set it when such a proxy strips the header from clients' requests.
_PROXY_SSL_HEADER = env("DJANGO_SECURE_PROXY_SSL_HEADER", "")
if _PROXY_SSL_HEADER:
    _header, _, _value = _PROXY_SSL_HEADER.partition("=")
    if not re.fullmatch(r"[A-Za-z0-9-]+", _header.strip()) or not _value.strip():
        raise ImproperlyConfigured(
            f"DJANGO_SECURE_PROXY_SSL_HEADER must look like 'X-Forwarded-Proto=https', not {_PROXY_SSL_HEADER!r}."
        )
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _header.strip().upper().replace("-", "_"), _value.strip())
# Proxies (addresses or networks, comma-separated) whose X-Forwarded-For header is believed: the audit log records
# the client address they forwarded. Empty: the audit log records the peer's address (REMOTE_ADDR).
CONCH_TRUSTED_PROXIES = env("CONCH_TRUSTED_PROXIES", [], cast=list)
for _proxy in CONCH_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"CONCH_TRUSTED_PROXIES must list IP addresses or networks such as 10.0.0.0/8, not {_proxy!r}."
        ) from None


def _production_problems() -> list[str]:
    """What makes this configuration unsafe to serve (Django's `check --deploy` rules, made fatal)."""
    problems = []
    if SECRET_KEY == DEVELOPMENT_SECRET_KEY:
        problems.append("DJANGO_SECRET_KEY is not set (the development key is public)")
    elif len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5 or SECRET_KEY.startswith("django-insecure-"):
        problems.append(
            f"DJANGO_SECRET_KEY is weak ({len(SECRET_KEY)} characters; at least 50 with 5 different ones are needed)"
        )
    if DEBUG:
        problems.append("DJANGO_DEBUG is on (error pages would show settings and code to anyone)")
    if "*" in ALLOWED_HOSTS:
        problems.append("DJANGO_ALLOWED_HOSTS contains '*' (list the host names Conch is served under)")
    return problems


if PRODUCTION and (_problems := _production_problems()):
    raise ImproperlyConfigured(
        "CONCH_ENV=production refuses to start: "
        + "; ".join(_problems)
        + ". Generate a key with `python -c 'import secrets; print(secrets.token_urlsafe(50))'` and see .env.example."
    )

INSTALLED_APPS = [
    # The admin's theme (django-unfold): before django.contrib.admin, so its templates win. Its static files come
    # from the app's folder (WhiteNoise finds them, and collectstatic copies them).
    "unfold",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "tenancy",
    "models_registry",
    "builds",
    "uploads",
    "deployments",
    "console",
]
if not PRODUCTION:
    # Development tooling (`manage.py run_demo`): not part of a production installation.
    INSTALLED_APPS.append("devtools")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Before the others: their HTML error pages for /api/ paths become JSON {"detail", "field"} bodies.
    "conch.middleware.ApiErrorMiddleware",
    # Refuses a body over the view's limit (413 naming it) before anything reads it (CSRF reads form bodies).
    "conch.middleware.RequestBodyLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After authentication: mutations in the request are recorded in the audit log with its user and IP.
    "tenancy.middleware.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: turns a locked-out sign-in into the 429 page of conch.lockout.
    "axes.middleware.AxesMiddleware",
]

# django-axes checks for a lockout before any other backend checks the password; it must come first.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "conch.urls"
WSGI_APPLICATION = "conch.wsgi.application"
ASGI_APPLICATION = "conch.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context.console",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------
DATABASE_URL = env("DATABASE_URL", f"sqlite:///{VAR_DIR / 'conch.sqlite3'}")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web, worker and beat share one file: WAL lets readers run beside the writer,
    # IMMEDIATE transactions take the write lock up front (no deadlock on upgrade), and
    # the timeout (seconds) makes a busy writer wait instead of failing.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    DATABASES["default"].setdefault("TEST", {})["NAME"] = str(VAR_DIR / "test-conch.sqlite3")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
# Serve straight from the app and project static folders too, so no collectstatic is needed.
WHITENOISE_USE_FINDERS = True
LOGIN_URL = "/accounts/login/"
# The admin console (/admin/, staff only): django-unfold's settings.
UNFOLD = {
    "SITE_TITLE": "Conch admin",
    "SITE_HEADER": "Conch",
    "SITE_SUBHEADER": "Teams, quotas, tokens, deployments, clusters",
    "SITE_URL": "/",
    "SITE_SYMBOL": "hub",
    "SHOW_HISTORY": True,
    # Django's own admin login form, which refuses non-staff users (unfold's default accepts any active user and
    # only then finds they may not see the admin).
    "LOGIN": {"form": "django.contrib.admin.forms.AdminAuthenticationForm"},
}
LOGIN_REDIRECT_URL = "/"

# --- Sign-in throttling (django-axes, on the console's /accounts/login/ and the admin's login) ----------------
# After CONCH_LOGIN_FAILURE_LIMIT failed sign-ins for one username from one client address, that pair is locked
# out for CONCH_LOGIN_COOLOFF_SECONDS counted from its last failure: the login page answers 429 with Retry-After.
# Failures are kept in the database (axes' AccessAttempt, shown in the admin; `manage.py axes_reset` unlocks).
AXES_FAILURE_LIMIT = env("CONCH_LOGIN_FAILURE_LIMIT", 5, cast=int)
CONCH_LOGIN_COOLOFF_SECONDS = env("CONCH_LOGIN_COOLOFF_SECONDS", 900, cast=int)
if AXES_FAILURE_LIMIT < 1 or CONCH_LOGIN_COOLOFF_SECONDS < 1:
    raise ImproperlyConfigured("CONCH_LOGIN_FAILURE_LIMIT and CONCH_LOGIN_COOLOFF_SECONDS must be at least 1.")
AXES_COOLOFF_TIME = timedelta(seconds=CONCH_LOGIN_COOLOFF_SECONDS)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# No banner at start-up: the JSON log of a process starts with its own lines.
AXES_VERBOSE = False
# A failure while locked out does not push the end of the lockout further (the page keeps saying one time).
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "conch.lockout.lockout_response"
# The client address is REMOTE_ADDR (axes' default without django-ipware): a proxy in front of Conch makes every
# client one address, so the limit then counts per username behind that proxy.

# --- REST API -------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenancy.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenancy.authentication.IsAuthenticatedWithReadScope"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "conch.api.exception_handler",
    # JSON only: an API answer, error or not, is never an HTML page (Swagger UI at /api/v1/docs/ is the browser view).
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PAGINATION_CLASS": "conch.api.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    # One budget per API token, per signed-in user and per client address; rates in CONCH_API_RATES below.
    "DEFAULT_THROTTLE_CLASSES": ["conch.throttling.CallerRateThrottle"],
}
# Requests per API token, per console session user, and per client address without credentials, as
# "<count>/<second|minute|hour|day>", counted in the shared cache (CACHES below) in fixed windows of that period;
# inference through POST /api/v1/deployments/{id}/infer has a budget of its own per caller. Over a budget: 429 with
# Retry-After. The inference gateway (/serve/) is not counted here.
_RATE_VARIABLES = {
    "token": ("CONCH_API_RATE_PER_TOKEN", "600/minute"),
    "user": ("CONCH_API_RATE_PER_USER", "600/minute"),
    "anonymous": ("CONCH_API_RATE_ANONYMOUS", "60/minute"),
    "inference": ("CONCH_API_RATE_INFERENCE", "6000/minute"),
}
CONCH_API_RATES = {kind: env(variable, default) for kind, (variable, default) in _RATE_VARIABLES.items()}
_RATE = re.compile(r"[1-9][0-9]{0,8}/(second|minute|hour|day)")
for _kind, (_variable, _default) in _RATE_VARIABLES.items():
    if not _RATE.fullmatch(CONCH_API_RATES[_kind]):
        raise ImproperlyConfigured(
            f"{_variable} must look like '600/minute' (a count, then second, minute, hour or day), "
            f"not {CONCH_API_RATES[_kind]!r}."
        )
SPECTACULAR_SETTINGS = {
    "TITLE": "Conch API",
    "DESCRIPTION": "Upload a model, build it into a Triton model repository, deploy and observe it.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Separate request/response components, so upload fields are `format: binary` (a file picker).
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI served from the drf-spectacular-sidecar package, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Redis: one URL serves the Celery broker, the cache and the gateway's rate limit ------------------------
# CONCH_REDIS_URL (redis://[:password@]host:port/db, rediss:// with TLS): each of CELERY_BROKER_URL, CONCH_CACHE_URL and
# CONCH_GATEWAY_REDIS_URL falls back to it, so an installation names its Redis once; set one of those only to split it
# off on purpose. Empty (the one-machine demo): the filesystem broker and a per-process cache.
CONCH_REDIS_URL = env("CONCH_REDIS_URL", "")
if CONCH_REDIS_URL and not CONCH_REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise ImproperlyConfigured(f"CONCH_REDIS_URL must be redis://host:port/db or rediss://…, not {CONCH_REDIS_URL!r}.")

# --- Celery ---------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", "") or CONCH_REDIS_URL or "filesystem://"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env("CELERY_TASK_ALWAYS_EAGER", False, cast=bool)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Each worker also consumes its own queue `<node>.dq2`: liveness heartbeats are addressed to one worker.
CELERY_WORKER_DIRECT = True
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
        # Broadcast (pidbox) exchange files; kombu's default is ./control under the cwd.
        "control_folder": str(_broker_dir / "control"),
        # Seconds a worker sleeps between looks into an empty queue folder (kombu's default, 1 s, adds up to
        # 1 s before a queued build or deployment start is picked up). A look is one small folder listing.
        "polling_interval": env("CONCH_FILESYSTEM_BROKER_POLL_SECONDS", 0.1, cast=float),
    }

# Periods of the beat tasks, seconds.
CONCH_RECONCILE_INTERVAL_SECONDS = env("CONCH_RECONCILE_INTERVAL_SECONDS", 10.0, cast=float)
CONCH_METRICS_SCRAPE_INTERVAL_SECONDS = env("CONCH_METRICS_SCRAPE_INTERVAL_SECONDS", 5.0, cast=float)
CONCH_METRICS_RETENTION_SECONDS = env("CONCH_METRICS_RETENTION_SECONDS", 86400, cast=int)
# The sweepers (builds.sweep_stalled_versions, uploads.sweep_uploads) recover stuck builds and uploads every this
# many seconds.
CONCH_SWEEP_INTERVAL_SECONDS = env("CONCH_SWEEP_INTERVAL_SECONDS", 30.0, cast=float)
# TensorRT plan Jobs (deployments.services.plans): how often beat looks at the Jobs, how long a Job's pod may wait for
# a free GPU before the plan fails, and how long a Job may run at all (activeDeadlineSeconds).
CONCH_PLAN_POLL_INTERVAL_SECONDS = env("CONCH_PLAN_POLL_INTERVAL_SECONDS", 10.0, cast=float)
CONCH_PLAN_SCHEDULE_TIMEOUT_SECONDS = env("CONCH_PLAN_SCHEDULE_TIMEOUT_SECONDS", 900, cast=int)
CONCH_PLAN_JOB_DEADLINE_SECONDS = env("CONCH_PLAN_JOB_DEADLINE_SECONDS", 3600, cast=int)

# --- Heartbeats of builds and uploads (seconds) ------------------------------------
# A running build writes its heartbeat at each step and this often in between.
CONCH_BUILD_HEARTBEAT_SECONDS = env("CONCH_BUILD_HEARTBEAT_SECONDS", 5.0, cast=float)
# A build with no heartbeat for this long lost its worker: the sweeper queues its next attempt.
CONCH_BUILD_STALE_SECONDS = env("CONCH_BUILD_STALE_SECONDS", 60.0, cast=float)
# A build whose worker was lost this many times in a row fails (with a message; rebuild retries).
CONCH_BUILD_MAX_ATTEMPTS = env("CONCH_BUILD_MAX_ATTEMPTS", 3, cast=int)
# A build queued this long without a worker claiming it lost its message: the sweeper queues it again.
CONCH_BUILD_QUEUED_STALE_SECONDS = env("CONCH_BUILD_QUEUED_STALE_SECONDS", 300.0, cast=float)
# An upload records progress at most this often while bytes stream in.
CONCH_UPLOAD_HEARTBEAT_SECONDS = env("CONCH_UPLOAD_HEARTBEAT_SECONDS", 5.0, cast=float)
# An upload with no bytes for this long is given up: row, stored object and open multipart upload removed.
CONCH_UPLOAD_STALE_SECONDS = env("CONCH_UPLOAD_STALE_SECONDS", 600.0, cast=float)
# A resumable upload (POST /api/v1/models/{id}/uploads/) left unfinished this many hours after its last part was
# signed or received is aborted by the sweeper; its quota reservation ends then.
CONCH_UPLOAD_EXPIRES_HOURS = env("CONCH_UPLOAD_EXPIRES_HOURS", 24.0, cast=float)
# The console's upload page aborts (and sends again) a part whose bytes have not moved for this many seconds; a slow
# part that moves is never cut. (The `conch` CLI has its own, --stall-timeout / CONCH_STALL_TIMEOUT.)
CONCH_UPLOAD_STALL_SECONDS = env("CONCH_UPLOAD_STALL_SECONDS", 60.0, cast=float)
# Presigned part URLs of uploads straight to the bucket are valid this long.
CONCH_UPLOAD_PART_URL_SECONDS = env("CONCH_UPLOAD_PART_URL_SECONDS", 3600, cast=int)
# A model or version deletion that has not ended this long after it started (the object store failed, or its
# process died) is finished by the sweeper.
CONCH_DELETION_RETRY_SECONDS = env("CONCH_DELETION_RETRY_SECONDS", 60.0, cast=float)
# Repositories of superseded build attempts are garbage-collected once their version was idle this long.
CONCH_REPOSITORY_GC_GRACE_SECONDS = env("CONCH_REPOSITORY_GC_GRACE_SECONDS", 3600.0, cast=float)
if not CONCH_BUILD_HEARTBEAT_SECONDS < CONCH_BUILD_STALE_SECONDS:
    raise ImproperlyConfigured("CONCH_BUILD_HEARTBEAT_SECONDS must be smaller than CONCH_BUILD_STALE_SECONDS.")
if CONCH_UPLOAD_EXPIRES_HOURS <= 0 or not 60 <= CONCH_UPLOAD_PART_URL_SECONDS <= 7 * 86400:
    raise ImproperlyConfigured(
        "CONCH_UPLOAD_EXPIRES_HOURS must be above 0 and CONCH_UPLOAD_PART_URL_SECONDS from 60 to 604800 (S3's "
        "longest presigned URL)."
    )
if CONCH_UPLOAD_STALL_SECONDS <= 0:
    raise ImproperlyConfigured("CONCH_UPLOAD_STALL_SECONDS must be above 0 (seconds without progress).")
if CONCH_BUILD_MAX_ATTEMPTS < 1:
    raise ImproperlyConfigured("CONCH_BUILD_MAX_ATTEMPTS must be at least 1.")

# Liveness (conch.liveness, manage.py worker_health / beat_health): beat's heartbeat period, and how long a
# worker may go without running a heartbeat (while some pool process is idle) or beat without publishing.
CONCH_HEARTBEAT_INTERVAL_SECONDS = env("CONCH_HEARTBEAT_INTERVAL_SECONDS", 15.0, cast=float)
CONCH_WORKER_HEARTBEAT_MAX_AGE_SECONDS = env("CONCH_WORKER_HEARTBEAT_MAX_AGE_SECONDS", 60.0, cast=float)
CONCH_BEAT_HEARTBEAT_MAX_AGE_SECONDS = env("CONCH_BEAT_HEARTBEAT_MAX_AGE_SECONDS", 60.0, cast=float)

# --- Object store ---------------------------------------------------------------
CONCH_STORAGE_URL = env("CONCH_STORAGE_URL", (VAR_DIR / "storage").as_uri())
CONCH_S3_ENDPOINT_URL = env("CONCH_S3_ENDPOINT_URL", "")
CONCH_S3_REGION = env("CONCH_S3_REGION", "us-east-1")
CONCH_S3_ACCESS_KEY_ID = env("CONCH_S3_ACCESS_KEY_ID", "")
CONCH_S3_SECRET_ACCESS_KEY = env("CONCH_S3_SECRET_ACCESS_KEY", "")
# The S3 endpoint as browsers and the CLI reach it, for presigned upload URLs (empty: CONCH_S3_ENDPOINT_URL).
CONCH_S3_PUBLIC_ENDPOINT_URL = env("CONCH_S3_PUBLIC_ENDPOINT_URL", "")
# --- Request body limits (bytes; conch.limits). A body over its endpoint's limit is refused with 413 naming it.
# Inference requests (POST /api/v1/deployments/{id}/infer and the /serve/ gateway), read into memory.
DATA_UPLOAD_MAX_MEMORY_SIZE = env("CONCH_MAX_REQUEST_BODY_BYTES", 64 * 1024**2, cast=int)
# Model uploads, streamed to the object store (plus 1 MiB for the form fields and 32 MiB of sample inputs).
CONCH_MAX_UPLOAD_BYTES = env("CONCH_MAX_UPLOAD_BYTES", 4 * 1024**3, cast=int)
# Every other request: JSON bodies of the API, console and admin forms.
CONCH_MAX_JSON_BODY_BYTES = env("CONCH_MAX_JSON_BODY_BYTES", 1024**2, cast=int)
if min(DATA_UPLOAD_MAX_MEMORY_SIZE, CONCH_MAX_UPLOAD_BYTES, CONCH_MAX_JSON_BODY_BYTES) < 1024:
    raise ImproperlyConfigured(
        "CONCH_MAX_REQUEST_BODY_BYTES, CONCH_MAX_UPLOAD_BYTES and CONCH_MAX_JSON_BODY_BYTES must be at least 1024."
    )

# --- The console's web server (`python -m conch.web`: uvicorn with Django's ASGI handler, conch.http_protocol) ---
# Seconds a client may take to send a request's line and headers, and seconds it may go without sending a byte of
# a request body; past either it gets 408 and its connection is closed.
CONCH_WEB_HEADER_TIMEOUT_SECONDS = env("CONCH_WEB_HEADER_TIMEOUT_SECONDS", 20.0, cast=float)
CONCH_WEB_BODY_TIMEOUT_SECONDS = env("CONCH_WEB_BODY_TIMEOUT_SECONDS", 30.0, cast=float)
if min(CONCH_WEB_HEADER_TIMEOUT_SECONDS, CONCH_WEB_BODY_TIMEOUT_SECONDS) <= 0:
    raise ImproperlyConfigured("CONCH_WEB_HEADER_TIMEOUT_SECONDS and CONCH_WEB_BODY_TIMEOUT_SECONDS must be above 0.")

# Sample inputs (`.npz`) of an upload or a rebuild: the arrays they unpack to, in bytes, and how many arrays one file
# may hold. Checked from the archive's directory and each array's header before anything is unpacked (413 naming
# the limit), in the web process and again in the worker.
CONCH_MAX_SAMPLE_UNPACKED_BYTES = env("CONCH_MAX_SAMPLE_UNPACKED_BYTES", 256 * 1024**2, cast=int)
CONCH_MAX_SAMPLE_ARRAYS = env("CONCH_MAX_SAMPLE_ARRAYS", 256, cast=int)
if CONCH_MAX_SAMPLE_UNPACKED_BYTES < 1 or CONCH_MAX_SAMPLE_ARRAYS < 1:
    raise ImproperlyConfigured("CONCH_MAX_SAMPLE_UNPACKED_BYTES and CONCH_MAX_SAMPLE_ARRAYS must be at least 1.")

# Archives (zip, tar, tar.gz/.bz2/.xz) of a model, unpacked in the build's sandbox (builds.archives): bytes of all
# members unpacked, how many members one may list, and unpacked bytes per byte of the archive (zip bombs unpack to
# thousands of times their size; a model's weights compress little). A member past any fails the build naming it.
CONCH_ARCHIVE_MAX_UNPACKED_BYTES = env("CONCH_ARCHIVE_MAX_UNPACKED_BYTES", 8 * 1024**3, cast=int)
CONCH_ARCHIVE_MAX_MEMBERS = env("CONCH_ARCHIVE_MAX_MEMBERS", 10_000, cast=int)
CONCH_ARCHIVE_MAX_RATIO = env("CONCH_ARCHIVE_MAX_RATIO", 100.0, cast=float)
if CONCH_ARCHIVE_MAX_UNPACKED_BYTES < 1 or CONCH_ARCHIVE_MAX_MEMBERS < 1 or CONCH_ARCHIVE_MAX_RATIO < 1:
    raise ImproperlyConfigured(
        "CONCH_ARCHIVE_MAX_UNPACKED_BYTES and CONCH_ARCHIVE_MAX_MEMBERS must be at least 1, CONCH_ARCHIVE_MAX_RATIO at "
        "least 1.0."
    )

# Execution environments of Python models (builds.environments): the Triton they are built for (its Python
# backend stub's Python, where that interpreter lies on the servers, their glibc), extra wheel folders or URLs for
# pip (space-separated; the index itself is pip's own setting, PIP_INDEX_URL), how long pip may take, and how many
# bytes an installed environment may hold. The defaults fit the local Triton of the nvidia-pytriton wheel; for
# NVIDIA's Triton containers set the container's Python (e.g. 3.12, /usr/bin) and glibc.
CONCH_TRITON_PYTHON_VERSION = env("CONCH_TRITON_PYTHON_VERSION", f"{sys.version_info.major}.{sys.version_info.minor}")
CONCH_TRITON_PYTHON_HOME = env(
    "CONCH_TRITON_PYTHON_HOME", str(Path(getattr(sys, "_base_executable", sys.executable)).parent)
)
CONCH_TRITON_GLIBC = env("CONCH_TRITON_GLIBC", "2.35")
# Requirement specifiers every environment must meet (space-separated pip constraints): Triton 2.51's Python
# backend stub returns empty tensors with numpy 2 in the environment (seen here), so numpy stays below 2.
CONCH_TRITON_PYTHON_CONSTRAINTS = tuple(env("CONCH_TRITON_PYTHON_CONSTRAINTS", "numpy<2").split())
# The CPU architecture of the servers that load custom backend libraries (builds.backend_library), as Python's
# platform.machine() names it: x86_64 or aarch64. Default: this host's.
CONCH_TRITON_MACHINE = env("CONCH_TRITON_MACHINE", platform.machine())
# Largest custom backend archive a registration takes, in bytes (POST /api/v1/backends/).
CONCH_MAX_BACKEND_BYTES = env("CONCH_MAX_BACKEND_BYTES", 2 * 1024**3, cast=int)
CONCH_ENVIRONMENT_FIND_LINKS = tuple(env("CONCH_ENVIRONMENT_FIND_LINKS", "").split())
CONCH_ENVIRONMENT_TIMEOUT_SECONDS = env("CONCH_ENVIRONMENT_TIMEOUT_SECONDS", 900.0, cast=float)
CONCH_ENVIRONMENT_MAX_BYTES = env("CONCH_ENVIRONMENT_MAX_BYTES", 4 * 1024**3, cast=int)
if not re.fullmatch(r"3\.\d{1,2}", CONCH_TRITON_PYTHON_VERSION) or not re.fullmatch(r"2\.\d{1,3}", CONCH_TRITON_GLIBC):
    raise ImproperlyConfigured("CONCH_TRITON_PYTHON_VERSION must look like 3.11 and CONCH_TRITON_GLIBC like 2.35.")

# --- Default team quotas (a team without a limit set in the admin, the API or `manage.py set_quota`) ----------
# GPUs: nvidia.com/gpu over a team's Kubernetes deployments (replicas x GPUs per pod, autoscaling at its maximum),
# and as many slices of each MIG profile. Instances: model instances of local deployments, summed.
CONCH_QUOTA_GPUS = env("CONCH_QUOTA_GPUS", 8, cast=int)
CONCH_QUOTA_INSTANCES = env("CONCH_QUOTA_INSTANCES", 16, cast=int)
CONCH_QUOTA_STORAGE_BYTES = env("CONCH_QUOTA_STORAGE_BYTES", 50 * 1024**3, cast=int)
CONCH_QUOTA_MODELS = env("CONCH_QUOTA_MODELS", 20, cast=int)
CONCH_QUOTA_DEPLOYMENTS = env("CONCH_QUOTA_DEPLOYMENTS", 10, cast=int)

# --- Builds: limits of the child process that parses an uploaded model (builds.sandbox) ---
# CPU time (seconds, all threads) the parsing may use, and the child's address space (bytes, ~0.5 GB of it taken
# by Python, onnx and onnxruntime). A file past either fails its build with a message saying so.
CONCH_INSPECT_CPU_SECONDS = env("CONCH_INSPECT_CPU_SECONDS", 120, cast=int)
CONCH_INSPECT_MEMORY_BYTES = env("CONCH_INSPECT_MEMORY_BYTES", 8 * 1024**3, cast=int)
if CONCH_INSPECT_CPU_SECONDS < 1 or CONCH_INSPECT_MEMORY_BYTES < 256 * 1024**2:
    raise ImproperlyConfigured(
        "CONCH_INSPECT_CPU_SECONDS must be at least 1 and CONCH_INSPECT_MEMORY_BYTES at least 268435456 (256 MiB)."
    )

# --- Inference gateway (deployments.api.gateway, its own ASGI process: `python -m conch.gateway`) -----------
# Where the gateway listens, and the base URL clients use for it (`endpoints.gateway` of a deployment).
CONCH_GATEWAY_BIND = env("CONCH_GATEWAY_BIND", "127.0.0.1:8001")
CONCH_GATEWAY_URL = env("CONCH_GATEWAY_URL", f"http://{CONCH_GATEWAY_BIND}").rstrip("/")
# The gateway's KServe v2 gRPC service (same process, same tokens and limits); "" serves none. The address clients
# are told (`host:port`, the deployment's `endpoints.grpc_gateway`) defaults to the bind address.
CONCH_GATEWAY_GRPC_BIND = env("CONCH_GATEWAY_GRPC_BIND", "127.0.0.1:8002")
CONCH_GATEWAY_GRPC_ADDRESS = env("CONCH_GATEWAY_GRPC_ADDRESS", CONCH_GATEWAY_GRPC_BIND)
# Seconds a resolved (token, deployment) route is reused: a revoked token or a stopped deployment stops being
# served at most this long after the change.
CONCH_GATEWAY_ROUTE_CACHE_SECONDS = env("CONCH_GATEWAY_ROUTE_CACHE_SECONDS", 1.0, cast=float)
# Requests per minute one token may send through the gateway (a token's own `requests_per_minute` overrides it).
CONCH_GATEWAY_REQUESTS_PER_MINUTE = env("CONCH_GATEWAY_REQUESTS_PER_MINUTE", 60000, cast=int)
# Redis for the per-token rate limit shared by every gateway process (default CONCH_REDIS_URL; "" = the broker's,
# when it is Redis).
CONCH_GATEWAY_REDIS_URL = env("CONCH_GATEWAY_REDIS_URL", "") or CONCH_REDIS_URL
# Seconds between writes of counted usage to the database.
CONCH_GATEWAY_USAGE_FLUSH_SECONDS = env("CONCH_GATEWAY_USAGE_FLUSH_SECONDS", 2.0, cast=float)
# Largest inference request body in bytes; larger ones are refused with 413 before they are read.
CONCH_GATEWAY_MAX_BODY_BYTES = env("CONCH_GATEWAY_MAX_BODY_BYTES", 256 * 1024**2, cast=int)
# Bodies up to this many bytes are read whole before a Triton connection is taken; larger ones stream to Triton.
CONCH_GATEWAY_STREAM_FROM_BYTES = env("CONCH_GATEWAY_STREAM_FROM_BYTES", 4 * 1024**2, cast=int)
# Seconds a client may go quiet while sending a body before the gateway gives up on it (408).
CONCH_GATEWAY_CLIENT_IDLE_SECONDS = env("CONCH_GATEWAY_CLIENT_IDLE_SECONDS", 30.0, cast=float)
# Connections kept open to each Triton by one gateway process.
CONCH_GATEWAY_MAX_CONNECTIONS = env("CONCH_GATEWAY_MAX_CONNECTIONS", 64, cast=int)
# Bytes of POSIX shared memory the gateway registers with each Triton on its own host (the local runtime) to hand it
# the binary tensor data of inference requests without sending it over the socket (Triton's system shared-memory
# extension). 0: always send the bytes over HTTP. Only touched pages use memory.
CONCH_GATEWAY_SHARED_MEMORY_BYTES = env("CONCH_GATEWAY_SHARED_MEMORY_BYTES", 64 * 1024**2, cast=int)

# --- Triton (local runtime) -----------------------------------------------------
CONCH_TRITON_DIR = Path(env("CONCH_TRITON_DIR", str(VAR_DIR / "triton"))).resolve()
CONCH_TRITON_BIND_ADDRESS = env("CONCH_TRITON_BIND_ADDRESS", "127.0.0.1")
CONCH_TRITON_PUBLIC_HOST = env("CONCH_TRITON_PUBLIC_HOST", "127.0.0.1")
# Host Conch's own processes (web's infer proxy, the metrics scraper) use to reach local Tritons.
CONCH_TRITON_INTERNAL_HOST = env("CONCH_TRITON_INTERNAL_HOST", "127.0.0.1")
CONCH_TRITON_START_TIMEOUT_SECONDS = env("CONCH_TRITON_START_TIMEOUT_SECONDS", 120.0, cast=float)
# GPUs local Tritons may use: "auto" counts this host's /dev/nvidiaN devices; a whole number says it (0: CPU only).
# Deciding whether a local deployment may ask for GPU instances (instance_kind KIND_GPU).
CONCH_LOCAL_GPUS = env("CONCH_LOCAL_GPUS", "auto").strip().lower()
if CONCH_LOCAL_GPUS != "auto" and not (CONCH_LOCAL_GPUS.isascii() and CONCH_LOCAL_GPUS.isdigit()):
    raise ImproperlyConfigured(f"CONCH_LOCAL_GPUS must be 'auto' or a whole number, not {CONCH_LOCAL_GPUS!r}.")
# API tokens: how long a new one lives unless asked otherwise, and the longest a user may ask for (days).
CONCH_TOKEN_MAX_DAYS = env("CONCH_TOKEN_MAX_DAYS", 365, cast=int)
CONCH_TOKEN_DEFAULT_DAYS = env("CONCH_TOKEN_DEFAULT_DAYS", 90, cast=int)
# Kubernetes runtime: the most replicas (or autoscaling max_replicas) one deployment may ask for.
CONCH_KUBERNETES_MAX_REPLICAS = env("CONCH_KUBERNETES_MAX_REPLICAS", 64, cast=int)
# Kubernetes runtime: who may reach a deployment's Triton pods (each deployment gets a NetworkPolicy; equality
# selectors "key=value,..."). Conch's own pods (gateway, web, worker) reach the http, grpc and metrics ports: pods
# matching the POD selector in namespaces matching the NAMESPACE selector (empty: the deployment's own namespace).
# The monitoring pods (Prometheus, scraping through the PodMonitor) reach the metrics port only.
CONCH_KUBERNETES_CONCH_NAMESPACE_SELECTOR = env_labels("CONCH_KUBERNETES_CONCH_NAMESPACE_SELECTOR")
CONCH_KUBERNETES_CONCH_POD_SELECTOR = env_labels(
    "CONCH_KUBERNETES_CONCH_POD_SELECTOR", "app.kubernetes.io/part-of=conch"
)
CONCH_KUBERNETES_MONITORING_NAMESPACE_SELECTOR = env_labels(
    "CONCH_KUBERNETES_MONITORING_NAMESPACE_SELECTOR", "kubernetes.io/metadata.name=monitoring"
)
CONCH_KUBERNETES_MONITORING_POD_SELECTOR = env_labels(
    "CONCH_KUBERNETES_MONITORING_POD_SELECTOR", "app.kubernetes.io/name=prometheus"
)
# Builds verify on a warm Triton each worker process keeps (one model load per build, no server start); off: a
# throwaway Triton per build.
CONCH_VERIFY_WARM_SERVER = env("CONCH_VERIFY_WARM_SERVER", True, cast=bool)
# A start task writes a heartbeat every few seconds; one older than this (seconds) means the task died and
# reconcile queues the start again (it adopts the server the dead task spawned).
CONCH_DEPLOYMENT_HEARTBEAT_STALE_SECONDS = env("CONCH_DEPLOYMENT_HEARTBEAT_STALE_SECONDS", 60.0, cast=float)
# Ready this long (seconds) after a restart resets a deployment's restart count, and so its backoff.
CONCH_RESTART_BACKOFF_RESET_SECONDS = env("CONCH_RESTART_BACKOFF_RESET_SECONDS", 600.0, cast=float)
# Fernet keys (comma-separated, the first encrypts) for secrets kept at rest, e.g. a cluster's kubeconfig
# (conch.crypto); without them a key is derived from DJANGO_SECRET_KEY.
CONCH_FIELD_ENCRYPTION_KEYS = env("CONCH_FIELD_ENCRYPTION_KEYS", [], cast=list)
# Name of this worker host; local Tritons belong to the host that started them (default: the host name).
CONCH_WORKER_HOST = env("CONCH_WORKER_HOST", "")
# Tags every Triton this Conch starts (`--id=<instance>.dep.<id>`) and its Kubernetes objects, so a restarted Conch
# can find, adopt or kill its own and never touches another installation's. Default: "conch-" and 10 hex digits of
# the data folder's path, so two installations on one host (two checkouts, each with its own var/) never share one,
# while web, worker and beat of one installation (one CONCH_VAR_DIR) do.
CONCH_INSTANCE_ID = env("CONCH_INSTANCE_ID", "") or f"conch-{hashlib.sha256(str(VAR_DIR).encode()).hexdigest()[:10]}"
if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", CONCH_INSTANCE_ID):
    raise ImproperlyConfigured("CONCH_INSTANCE_ID must be 1-40 letters, digits, '_' or '-' (no '.').")

# --- Cache: API rate-limit counters, shared by every web process -------------------------------------------
# CONCH_CACHE_URL: redis://[:password@]host:port/db (rediss:// with TLS) for Django's RedisCache, or locmem://
# (each process counts alone). Default: CONCH_REDIS_URL, else the Celery broker's Redis when CELERY_BROKER_URL is
# redis:// or rediss://, else locmem:// (an empty value means the same). Keys start with CONCH_INSTANCE_ID; they all
# expire on their own.
_CELERY_BROKER_IS_REDIS = CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
CONCH_CACHE_URL = (
    env("CONCH_CACHE_URL", "") or CONCH_REDIS_URL or (CELERY_BROKER_URL if _CELERY_BROKER_IS_REDIS else "locmem://")
)
if CONCH_CACHE_URL.startswith(("redis://", "rediss://")):
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CONCH_CACHE_URL,
            "KEY_PREFIX": CONCH_INSTANCE_ID,
            # Seconds: a Redis that does not answer fails the request's rate check quickly (it then passes).
            "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
        }
    }
elif CONCH_CACHE_URL == "locmem://":
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "KEY_PREFIX": CONCH_INSTANCE_ID}}
else:
    raise ImproperlyConfigured(
        f"CONCH_CACHE_URL must be redis://host:port/db, rediss://… or locmem://, not {CONCH_CACHE_URL!r}."
    )

# Log records keep their structured fields (`extra=`): `plain` writes them as key=value after
# the message, `json` writes one JSON object per line (conch/logging.py).
CONCH_LOG_FORMAT = env("CONCH_LOG_FORMAT", "plain")
if CONCH_LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"CONCH_LOG_FORMAT={CONCH_LOG_FORMAT!r} is not 'plain' or 'json'.")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"()": "conch.logging.KeyValueFormatter"},
        "json": {"()": "conch.logging.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": CONCH_LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env("CONCH_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
# Celery workers and beat log through the handler above instead of replacing the root
# logger's handlers with Celery's own format (which drops the structured fields).
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
