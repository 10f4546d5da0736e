from toolgate.settings.base import *  # noqa: F403
from toolgate.settings.base import env

DEBUG = False
SECRET_KEY = env("SECRET_KEY", default="django-insecure-test-only-never-in-production")
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]

# Hashing cost matters only against stolen hashes; tests need speed.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Throttling is tested on purpose with its own rate, never by accident.
TOOLGATE_AGENT_THROTTLE_RATE = env("AGENT_THROTTLE_RATE", default="1000000/min")

# Tasks run in-process, right after the commit that enqueues them, whatever broker CI names; a
# test that starts a real worker sets CELERY_TASK_ALWAYS_EAGER=0 for it and for itself.
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=True)
CELERY_TASK_EAGER_PROPAGATES = CELERY_TASK_ALWAYS_EAGER
