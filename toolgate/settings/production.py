from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from toolgate.settings.base import *  # noqa: F403
from toolgate.settings.base import (
    BASE_DIR,
    CACHES,
    DATABASES,
    STORAGES,
    TOOLGATE_AUDIT_KEYS,
    TOOLGATE_OIDC_SERVER_URL,
    env,
)

DEBUG = False

# With single sign-on, only the provider logs people in, unless this says otherwise; the user
# names in TOOLGATE_PASSWORD_LOGIN_USERS (local administrators) still may (docs/identity.md).
TOOLGATE_PASSWORD_LOGIN = env.bool("TOOLGATE_PASSWORD_LOGIN", default=not TOOLGATE_OIDC_SERVER_URL)
SECRET_KEY = env("SECRET_KEY")

# Behind gunicorn a connection serves many requests (and keeps its prepared statements). A
# connection that failed is closed at the end of its request; health checks (a round trip at the
# start of every request) are there for networks that drop idle connections.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=600)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = env.bool("CONN_HEALTH_CHECKS", default=False)

# Each web process would count an agent's requests alone, letting through the rate times the
# number of processes: the throttle needs the one count that Redis keeps for all of them.
if CACHES["default"]["BACKEND"] != "django_redis.cache.RedisCache":
    raise ImproperlyConfigured(
        "CACHE_URL must name Redis in production (such as redis://127.0.0.1:6379/1): the agent "
        "throttle counts there for every web process."
    )

# Every process that writes the audit signs its chains' links; without the key a row appended
# through the database alone could not be told from the product's.
if not TOOLGATE_AUDIT_KEYS:
    raise ImproperlyConfigured(
        "TOOLGATE_AUDIT_KEYS (id:secret, newest first) or TOOLGATE_AUDIT_KEYS_FILE must give the "
        "audit chains' key in production (docs/audit.md)."
    )

SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
# The app runs behind a TLS-terminating proxy that sets this header.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=60 * 60 * 24 * 365)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# Where collectstatic writes and nginx serves /static/ from (deploy/nginx/toolgate.conf).
STATIC_ROOT = Path(env("STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
STORAGES = {
    **STORAGES,
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

TOOLGATE_GATEWAY_FAULTS = env.bool("TOOLGATE_GATEWAY_FAULTS", default=False)
