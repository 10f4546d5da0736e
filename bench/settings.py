"""Settings for benchmark (b), the API under gunicorn: production's, on the bench database.

Only what a benchmark needs differs from production: plain HTTP on 127.0.0.1, a throttle rate no
load reaches (still counted in Redis, as in production), persistent database connections, quiet
logging, and the `bench` app with the bare endpoint's one table. `python -m bench.api` starts
gunicorn with this module.
"""

import os

# Production insists on a secret from the environment; the bench serves nothing real.
os.environ.setdefault("SECRET_KEY", "bench-only-insecure-secret-key-never-used-in-production")
os.environ.setdefault("TOOLGATE_AUDIT_KEYS", "bench:bench-only-audit-key-never-used-in-production")
# The bench database, configured as production configures its own: persistent connections,
# server-side binding and prepared statements (DATABASE_SERVER_SIDE_BINDING=0 turns them off).
os.environ["DATABASE_URL"] = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/toolgate_bench"
)
# Production counts the throttle in Redis, one round trip a request, and so does the bench.
os.environ["CACHE_URL"] = os.environ.get("BENCH_CACHE_URL", "redis://127.0.0.1:6379/1")

from toolgate.settings.production import *  # noqa: F403
from toolgate.settings.production import INSTALLED_APPS, REST_FRAMEWORK

DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
# Plain HTTP on loopback: no TLS-terminating proxy in front.
SECURE_SSL_REDIRECT = False

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]
ROOT_URLCONF = "bench.urls"

# The throttle still runs on every request (as in production), but never refuses one.
TOOLGATE_AGENT_THROTTLE_RATE = "1000000000/s"
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "DEFAULT_THROTTLE_RATES": {"agent": TOOLGATE_AGENT_THROTTLE_RATE},
}

TOOLGATE_GATEWAY_FAULTS = False

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
