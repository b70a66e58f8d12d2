"""Production settings refuse to start insecure, and turn HTTPS protections on; docker compose keeps secrets out.

Settings are read once per process, so each case runs Django in a subprocess with only the variables it sets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
GOOD_KEY = "k3V9-pQz_7Rw2mXc8LdT4bYh6NsJf1GaUe5oKiZr0Hq3WnCy9Ps"  # 51 characters, made up for these tests
PRINT_SETTINGS = (
    "import json, django; django.setup(); from django.conf import settings as s; print(json.dumps({name: "
    "getattr(s, name, None) for name in ('CONCH_ENV', 'DEBUG', 'SECURE_SSL_REDIRECT', 'SESSION_COOKIE_SECURE', "
    "'CSRF_COOKIE_SECURE', 'SECURE_HSTS_SECONDS', 'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SECURE_HSTS_PRELOAD', "
    "'SECURE_PROXY_SSL_HEADER')}))"
)


def _run(tmp_path: Path, arguments: list[str], **variables: str) -> subprocess.CompletedProcess:
    environment = {
        "PATH": os.environ.get("PATH", os.defpath),
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "conch.settings",
        "CONCH_VAR_DIR": str(tmp_path / "var"),
        **variables,
    }
    return subprocess.run(
        [sys.executable, *arguments], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300
    )


def _settings(tmp_path: Path, **variables: str) -> dict:
    completed = _run(tmp_path, ["-c", PRINT_SETTINGS], **variables)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


@pytest.mark.parametrize(
    ("variables", "problem"),
    [
        ({}, "DJANGO_SECRET_KEY is not set (the development key is public)"),
        ({"DJANGO_SECRET_KEY": "change-me"}, "DJANGO_SECRET_KEY is weak (9 characters; at least 50"),
        ({"DJANGO_SECRET_KEY": "a" * 60}, "DJANGO_SECRET_KEY is weak (60 characters; at least 50 with 5 different"),
        ({"DJANGO_SECRET_KEY": GOOD_KEY, "DJANGO_DEBUG": "true"}, "DJANGO_DEBUG is on"),
        ({"DJANGO_SECRET_KEY": GOOD_KEY, "DJANGO_ALLOWED_HOSTS": "*"}, "DJANGO_ALLOWED_HOSTS contains '*'"),
    ],
)
def test_production_refuses_to_start_with_an_insecure_configuration(tmp_path, variables, problem):
    # when
    completed = _run(tmp_path, ["-c", "import django; django.setup()"], CONCH_ENV="production", **variables)

    # then
    assert completed.returncode != 0
    [last_line] = completed.stderr.strip().splitlines()[-1:]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured: CONCH_ENV=production refuses to start: ")
    assert problem in last_line
    assert "secrets.token_urlsafe(50)" in last_line


def test_production_names_every_problem_at_once(tmp_path):
    completed = _run(
        tmp_path,
        ["-c", "import django; django.setup()"],
        CONCH_ENV="production",
        DJANGO_DEBUG="1",
        DJANGO_ALLOWED_HOSTS="conch.example.com,*",
    )

    assert completed.returncode != 0
    for problem in ("DJANGO_SECRET_KEY is not set", "DJANGO_DEBUG is on", "DJANGO_ALLOWED_HOSTS contains '*'"):
        assert problem in completed.stderr


def test_a_good_production_configuration_starts_with_https_protections_on(tmp_path):
    # when
    values = _settings(
        tmp_path,
        CONCH_ENV="production",
        DJANGO_SECRET_KEY=GOOD_KEY,
        DJANGO_ALLOWED_HOSTS="conch.example.com",
        DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto=https",
    )

    # then
    assert values == {
        "CONCH_ENV": "production",
        "DEBUG": False,
        "SECURE_SSL_REDIRECT": True,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 31_536_000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": True,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
    }


def test_production_https_settings_follow_the_environment(tmp_path):
    values = _settings(
        tmp_path,
        CONCH_ENV="production",
        DJANGO_SECRET_KEY=GOOD_KEY,
        DJANGO_SECURE_SSL_REDIRECT="false",
        DJANGO_SECURE_HSTS_SECONDS="3600",
        DJANGO_SECURE_HSTS_PRELOAD="false",
    )

    assert (values["SECURE_SSL_REDIRECT"], values["SECURE_HSTS_SECONDS"], values["SECURE_HSTS_PRELOAD"]) == (
        False,
        3600,
        False,
    )
    assert values["SESSION_COOKIE_SECURE"] is True


def test_development_keeps_the_plain_http_demo_working(tmp_path):
    values = _settings(tmp_path)

    assert values["CONCH_ENV"] == "development"
    assert (values["SECURE_SSL_REDIRECT"], values["SESSION_COOKIE_SECURE"], values["SECURE_HSTS_SECONDS"]) == (
        False,
        False,
        0,
    )
    assert values["SECURE_PROXY_SSL_HEADER"] is None


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"CONCH_ENV": "staging"}, "CONCH_ENV must be 'development' or 'production', not 'staging'."),
        ({"DJANGO_SECURE_PROXY_SSL_HEADER": "https"}, "DJANGO_SECURE_PROXY_SSL_HEADER must look like"),
        ({"CONCH_LOCAL_GPUS": "two"}, "CONCH_LOCAL_GPUS must be 'auto' or a whole number, not 'two'."),
        (
            {"CONCH_KUBERNETES_CONCH_POD_SELECTOR": "app=conch,role"},
            "CONCH_KUBERNETES_CONCH_POD_SELECTOR='app=conch,role': 'role' is not a Kubernetes label 'key=value'.",
        ),
        (
            {"CONCH_KUBERNETES_MONITORING_NAMESPACE_SELECTOR": "name=not valid"},
            "'name=not valid' is not a Kubernetes label 'key=value'.",
        ),
    ],
)
def test_unknown_values_are_refused(tmp_path, variables, message):
    completed = _run(tmp_path, ["-c", "import django; django.setup()"], **variables)

    assert completed.returncode != 0
    assert message in completed.stderr


def test_the_deploy_security_checks_pass_in_production_and_not_in_development(tmp_path):
    command = ["manage.py", "check", "--deploy", "--tag", "security", "--fail-level", "WARNING"]

    production = _run(tmp_path, command, CONCH_ENV="production", DJANGO_SECRET_KEY=GOOD_KEY)
    development = _run(tmp_path, command, DJANGO_SECRET_KEY=GOOD_KEY)

    assert production.returncode == 0, production.stderr
    assert "System check identified no issues" in production.stdout
    assert development.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in development.stderr


def test_docker_compose_publishes_no_backing_service_and_keeps_secrets_in_an_env_file():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]

    # No port of the database, Redis or MinIO (or anything else) on all interfaces.
    published = {name: service.get("ports", []) for name, service in services.items()}
    assert published["postgres"] == [] and published["redis"] == []
    assert all(str(port).startswith("127.0.0.1:") for ports in published.values() for port in ports)
    # Conch runs in production mode and reads its secrets from conch.env, which git ignores.
    for name in ("migrate", "web", "worker", "beat"):
        assert services[name]["environment"]["CONCH_ENV"] == "production"
        assert services[name]["env_file"] == ["conch.env"]
    for name, service in services.items():
        environment = service.get("environment") or {}
        secret_names = [key for key in environment if any(word in key for word in ("SECRET", "PASSWORD", "KEY"))]
        assert secret_names == [], name
        assert "DATABASE_URL" not in environment, name
    assert "conch.env" in (ROOT / ".gitignore").read_text().splitlines()
    example = (ROOT / "conch.env.example").read_text()
    for name in ("DJANGO_SECRET_KEY", "DATABASE_URL", "POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD"):
        assert f"\n{name}=" in example


def _instance_id(tmp_path: Path, var_dir: Path, **variables: str) -> str:
    code = "import django; django.setup(); from django.conf import settings; print(settings.CONCH_INSTANCE_ID)"
    completed = _run(tmp_path, ["-c", code], CONCH_VAR_DIR=str(var_dir), **variables)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip()


def test_each_data_folder_is_an_installation_with_an_instance_id_of_its_own(tmp_path):
    # when two checkouts' processes read their settings, neither setting CONCH_INSTANCE_ID
    first = _instance_id(tmp_path, tmp_path / "a" / "var")
    again = _instance_id(tmp_path, tmp_path / "a" / "var")
    second = _instance_id(tmp_path, tmp_path / "b" / "var")
    # then each data folder has its own id, the same in every process that reads it (web, worker, beat)
    assert first == again != second
    assert re.fullmatch(r"conch-[0-9a-f]{10}", first) and re.fullmatch(r"conch-[0-9a-f]{10}", second)
    # and an id that is set wins
    assert _instance_id(tmp_path, tmp_path / "a" / "var", CONCH_INSTANCE_ID="prod_1") == "prod_1"


def _redis_uses(tmp_path: Path, **variables: str) -> list:
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.CELERY_BROKER_URL, s.CACHES['default'].get('LOCATION', 'locmem'), "
        "s.CONCH_GATEWAY_REDIS_URL]))"
    )
    completed = _run(tmp_path, ["-c", code], **variables)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_one_redis_url_serves_the_broker_the_cache_and_the_gateway_unless_one_is_split_off(tmp_path):
    one = "redis://127.0.0.1:6379/3"
    # when only CONCH_REDIS_URL is set, all three use it
    assert _redis_uses(tmp_path, CONCH_REDIS_URL=one) == [one, one, one]
    # when the cache is split off on purpose, only it moves
    split = _redis_uses(tmp_path, CONCH_REDIS_URL=one, CONCH_CACHE_URL="redis://127.0.0.1:6379/4")
    assert split == [one, "redis://127.0.0.1:6379/4", one]
    # without any, the demo's filesystem broker and a per-process cache
    assert _redis_uses(tmp_path)[:2] == ["filesystem://", "locmem"]
    # and a URL that is not Redis is refused naming the variable
    completed = _run(tmp_path, ["-c", "import django; django.setup()"], CONCH_REDIS_URL="postgres://x/y")
    assert completed.returncode != 0 and "CONCH_REDIS_URL must be redis://" in completed.stderr


def test_network_policy_selectors_are_read_as_label_maps(tmp_path):
    # given
    script = (
        "import json, django; django.setup(); from django.conf import settings as s; print(json.dumps([s."
        "CONCH_KUBERNETES_CONCH_POD_SELECTOR, s.CONCH_KUBERNETES_CONCH_NAMESPACE_SELECTOR, "
        "s.CONCH_KUBERNETES_MONITORING_POD_SELECTOR, s.CONCH_KUBERNETES_MONITORING_NAMESPACE_SELECTOR]))"
    )
    # when: the defaults, then the operator's own selectors
    defaults = _run(tmp_path, ["-c", script])
    chosen = _run(
        tmp_path,
        ["-c", script],
        CONCH_KUBERNETES_CONCH_POD_SELECTOR=" app.kubernetes.io/name=conch , tier=gateway",
        CONCH_KUBERNETES_CONCH_NAMESPACE_SELECTOR="kubernetes.io/metadata.name=conch",
        CONCH_KUBERNETES_MONITORING_POD_SELECTOR="",
    )
    # then
    assert json.loads(defaults.stdout) == [
        {"app.kubernetes.io/part-of": "conch"},
        {},
        {"app.kubernetes.io/name": "prometheus"},
        {"kubernetes.io/metadata.name": "monitoring"},
    ]
    assert json.loads(chosen.stdout) == [
        {"app.kubernetes.io/name": "conch", "tier": "gateway"},
        {"kubernetes.io/metadata.name": "conch"},
        {},
        {"kubernetes.io/metadata.name": "monitoring"},
    ]
