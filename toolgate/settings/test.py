from toolgate.settings.base import *  # noqa: F403
from toolgate.settings.base import DEVELOPMENT_AUDIT_KEY, TOOLGATE_AUDIT_KEYS, env

DEBUG = False
SECRET_KEY = env("SECRET_KEY", default="django-insecure-test-only-never-in-production")
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]

# Hashing cost matters only against stolen hashes; tests need speed.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Throttling is tested on purpose with its own rate, never by accident.
TOOLGATE_AGENT_THROTTLE_RATE = env("AGENT_THROTTLE_RATE", default="1000000/min")

# Tasks run in-process right after the commit that enqueues them, as in the embedded default,
# even where CELERY_BROKER_URL names Redis; the tests of a real worker start one on purpose.
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True

# seed_demo's 30 days of traffic take seconds; the tests that want it ask for it.
TOOLGATE_DEMO_HISTORY_SESSIONS = 0

# The audit chains' development key, unless the environment gives one.
TOOLGATE_AUDIT_KEYS = TOOLGATE_AUDIT_KEYS or [DEVELOPMENT_AUDIT_KEY]
