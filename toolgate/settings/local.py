from toolgate.settings.base import *  # noqa: F403
from toolgate.settings.base import DEVELOPMENT_AUDIT_KEY, TOOLGATE_AUDIT_KEYS, env

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env("SECRET_KEY", default="django-insecure-local-only-never-in-production")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])

# The audit chains' development key, public: only on a DEBUG site with no key of its own.
if DEBUG and not TOOLGATE_AUDIT_KEYS:
    TOOLGATE_AUDIT_KEYS = [DEVELOPMENT_AUDIT_KEY]
