"""The production settings pass Django's deployment checks, as docs/configuration.md promises."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_production_settings_pass_the_deploy_check() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "toolgate.settings.production",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "TOOLGATE_AUDIT_KEYS": f"1:{secrets.token_hex(32)}",
        # Named, not reached: the check connects to no cache.
        "CACHE_URL": "redis://127.0.0.1:6379/1",
    }
    completed = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_production_settings_refuse_to_start_without_a_secret_key() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    env["DJANGO_SETTINGS_MODULE"] = "toolgate.settings.production"
    env["TOOLGATE_AUDIT_KEYS"] = f"1:{secrets.token_hex(32)}"
    completed = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.returncode != 0
    assert "SECRET_KEY" in completed.stderr


@pytest.mark.parametrize("cache_url", [None, "locmemcache://", "dbcache://cache_table"])
def test_production_settings_refuse_to_start_without_a_shared_cache(cache_url: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CACHE_URL"}
    env["DJANGO_SETTINGS_MODULE"] = "toolgate.settings.production"
    env["TOOLGATE_AUDIT_KEYS"] = f"1:{secrets.token_hex(32)}"
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    if cache_url is not None:
        env["CACHE_URL"] = cache_url

    completed = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert completed.returncode != 0
    assert "ImproperlyConfigured: CACHE_URL must name Redis in production" in completed.stderr
