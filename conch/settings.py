"""Django settings for Conch, all read from the environment (see `.env.example`).

Embedded defaults (no variable set) run everything on one machine: SQLite under
`var/`, kombu's filesystem transport as the Celery broker, a folder as object store,
and local `tritonserver` processes. Production sets DATABASE_URL (PostgreSQL),
CELERY_BROKER_URL (Redis) and CONCH_STORAGE_URL (s3://...).
"""

from __future__ import annotations

import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from conch.env import env

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env("CONCH_VAR_DIR", str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = env("DJANGO_SECRET_KEY", "conch-insecure-development-key-change-me")
DEBUG = env("DJANGO_DEBUG", False, cast=bool)
ALLOWED_HOSTS = env("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"], cast=list)
CSRF_TRUSTED_ORIGINS = env("DJANGO_CSRF_TRUSTED_ORIGINS", [], cast=list)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "tenancy",
    "models_registry",
    "builds",
    "deployments",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Before the others: their HTML error pages for /api/ paths become JSON {"detail", "field"} bodies.
    "conch.middleware.ApiErrorMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
LOGIN_REDIRECT_URL = "/deployments/"

# --- REST API -------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenancy.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "conch.api.exception_handler",
    # JSON only: an API answer, error or not, is never an HTML page (Swagger UI at /api/v1/docs/ is the browser view).
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PAGINATION_CLASS": "conch.api.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
}
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

# --- Celery ---------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", "filesystem://")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env("CELERY_TASK_ALWAYS_EAGER", False, cast=bool)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
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
    }

# Periods of the beat tasks, seconds.
CONCH_RECONCILE_INTERVAL_SECONDS = env("CONCH_RECONCILE_INTERVAL_SECONDS", 10.0, cast=float)
CONCH_METRICS_SCRAPE_INTERVAL_SECONDS = env("CONCH_METRICS_SCRAPE_INTERVAL_SECONDS", 5.0, cast=float)
CONCH_METRICS_RETENTION_SECONDS = env("CONCH_METRICS_RETENTION_SECONDS", 86400, cast=int)

# --- Object store ---------------------------------------------------------------
CONCH_STORAGE_URL = env("CONCH_STORAGE_URL", (VAR_DIR / "storage").as_uri())
CONCH_S3_ENDPOINT_URL = env("CONCH_S3_ENDPOINT_URL", "")
CONCH_S3_REGION = env("CONCH_S3_REGION", "us-east-1")
CONCH_S3_ACCESS_KEY_ID = env("CONCH_S3_ACCESS_KEY_ID", "")
CONCH_S3_SECRET_ACCESS_KEY = env("CONCH_S3_SECRET_ACCESS_KEY", "")
# Largest non-file request body (e.g. a JSON inference request through /infer), bytes.
DATA_UPLOAD_MAX_MEMORY_SIZE = env("CONCH_MAX_REQUEST_BODY_BYTES", 64 * 1024**2, cast=int)
CONCH_MAX_UPLOAD_BYTES = env("CONCH_MAX_UPLOAD_BYTES", 4 * 1024**3, cast=int)

# --- Triton (local runtime) -----------------------------------------------------
CONCH_TRITON_DIR = Path(env("CONCH_TRITON_DIR", str(VAR_DIR / "triton"))).resolve()
CONCH_TRITON_BIND_ADDRESS = env("CONCH_TRITON_BIND_ADDRESS", "127.0.0.1")
CONCH_TRITON_PUBLIC_HOST = env("CONCH_TRITON_PUBLIC_HOST", "127.0.0.1")
# Host Conch's own processes (web's infer proxy, the metrics scraper) use to reach local Tritons.
CONCH_TRITON_INTERNAL_HOST = env("CONCH_TRITON_INTERNAL_HOST", "127.0.0.1")
CONCH_TRITON_START_TIMEOUT_SECONDS = env("CONCH_TRITON_START_TIMEOUT_SECONDS", 120.0, cast=float)
# Tags every Triton this Conch starts (`--id=<prefix>-...`), so a restarted Conch can
# find, adopt or kill its own processes and never touches another installation's.
CONCH_INSTANCE_ID = env("CONCH_INSTANCE_ID", "conch")
if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", CONCH_INSTANCE_ID):
    raise ImproperlyConfigured("CONCH_INSTANCE_ID must be 1-40 letters, digits, '_' or '-' (no '.').")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("CONCH_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
