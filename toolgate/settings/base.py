"""Settings shared by every environment, read from the environment with django-environ.

SECRET_KEY is set by each environment module: only local and test have an insecure default.
"""

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS: list[str] = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS: list[str] = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # OpClass in index expressions (the audit trail's trigram index); inert on SQLite.
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    # A second factor (TOTP and recovery codes) before money moves above a policy's line.
    "allauth",
    "allauth.account",
    "allauth.mfa",
    # Single sign-on with an OpenID Connect provider, configured from the environment below.
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "django_htmx",
    "django_tables2",
    "django_filters",
    "orders",
    "retail",
    "upstreams",
    "dispatch",
    "approvals",
    "analytics",
    "records",
    "books",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Times on the pages in the zone the browser reported (a cookie), else UTC.
    "toolgate.timezones.BrowserTimezoneMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # The managers' pages and API: a slot each, a statement timeout, and an answer in time.
    "analytics.heavy.ManagerRequestMiddleware",
    # allauth's pages (the second factor's enrolment) keep their state in the session.
    "allauth.account.middleware.AccountMiddleware",
    # The identity provider away: a page that says so (toolgate/accounts.py).
    "toolgate.accounts.ProviderDownMiddleware",
    # Last, as axes asks: it turns a login refused for a lockout into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "toolgate.urls"
WSGI_APPLICATION = "toolgate.wsgi.application"

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
                # The places of the signed-in user, for the navigation of every page.
                "toolgate.navigation.navigation",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=0)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Parameters are bound by the server, and a statement a connection runs again and again (the
    # pipeline's every call) is prepared once, so PostgreSQL no longer parses and plans it anew.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=env.bool("DATABASE_SERVER_SIDE_BINDING", default=True),
        prepare_threshold=env.int("DATABASE_PREPARE_THRESHOLD", default=2),
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The covering indexes' extra columns are PostgreSQL's; SQLite keeps the index without them.
    SILENCED_SYSTEM_CHECKS = ["models.W040"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# A redis:// URL selects django-redis, where the agent throttle counts across every web process;
# the default counts in each process alone, which production refuses (settings/production.py).
CACHES = {"default": env.cache_url("CACHE_URL", default="locmemcache://")}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Axes comes first: it refuses a locked-out user name and address before a password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "toolgate.accounts.PasswordLoginBackend",
]
# Failed logins are counted per user name and client address, in the database (shared by every
# web process); past the limit that pair is refused until it has made no attempt for the
# cool-off, and the page says so (toolgate.views.login_locked_out). The browser's login and the
# admin's are both covered.
AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("LOGIN_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "dispatch.client_address.client_address"
AXES_LOCKOUT_CALLABLE = "toolgate.views.login_locked_out"
# How many proxies in front of the app append to X-Forwarded-For (nginx: 1). 0 trusts no header:
# the client's address is the socket's (dispatch/client_address.py). Never set it above the
# number of proxies that really append, or clients choose the address they are recorded under.
TOOLGATE_TRUSTED_PROXY_COUNT = env.int("TOOLGATE_TRUSTED_PROXY_COUNT", default=0)

# The second factor (docs/identity.md): django-allauth's MFA keeps each user's authenticator app
# (TOTP) and recovery codes; the login stays Toolgate's own, and nobody signs up through allauth.
ACCOUNT_ADAPTER = "toolgate.accounts.ClosedSignupAdapter"
ACCOUNT_LOGIN_METHODS = {"username"}
ACCOUNT_SIGNUP_FIELDS = ["username*", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = "none"
MFA_SUPPORTED_TYPES = ["totp", "recovery_codes"]
MFA_TOTP_ISSUER = env.str("TOOLGATE_TOTP_ISSUER", default="Toolgate")
# How long a second factor given on the pages stays fresh for approvals above the line.
TOOLGATE_FACTOR_FRESH_SECONDS = env.int("TOOLGATE_FACTOR_FRESH_SECONDS", default=300)

# Single sign-on (docs/identity.md): an OpenID Connect provider's issuer, this site's client at
# it, and which of its groups (in the claim TOOLGATE_OIDC_GROUPS_CLAIM) make a reviewer, a manager
# or an administrator: TOOLGATE_OIDC_ROLES=reviewers=toolgate-reviewers,managers=...
TOOLGATE_OIDC_SERVER_URL = env.str("TOOLGATE_OIDC_SERVER_URL", default="")
TOOLGATE_OIDC_NAME = env.str("TOOLGATE_OIDC_NAME", default="single sign-on")
TOOLGATE_OIDC_GROUPS_CLAIM = env.str("TOOLGATE_OIDC_GROUPS_CLAIM", default="groups")
TOOLGATE_OIDC_ROLES: dict[str, str] = env.dict("TOOLGATE_OIDC_ROLES", default={})
SOCIALACCOUNT_ADAPTER = "toolgate.accounts.SingleSignOnAdapter"
SOCIALACCOUNT_AUTO_SIGNUP = True
# The provider's tokens are kept (allauth's SocialToken): before a decision moves money, a single
# sign-on reviewer needs the provider's word younger than this many seconds, its userinfo
# endpoint asked with them (approvals/provider_check.py).
SOCIALACCOUNT_STORE_TOKENS = True
TOOLGATE_OIDC_CHECK_SECONDS = env.int("TOOLGATE_OIDC_CHECK_SECONDS", default=300)
# The provider's own second factor, as its ID token says (`amr` methods, or `acr` values),
# counts as Toolgate's for TOOLGATE_FACTOR_FRESH_SECONDS after its `auth_time`.
TOOLGATE_OIDC_FACTOR_AMR: list[str] = env.list(
    "TOOLGATE_OIDC_FACTOR_AMR", default=["mfa", "otp", "hwk"]
)
TOOLGATE_OIDC_FACTOR_ACR: list[str] = env.list("TOOLGATE_OIDC_FACTOR_ACR", default=[])
# Password logins (docs/identity.md): off, only the user names listed (local administrators)
# log in with a password; everyone else with the provider.
TOOLGATE_PASSWORD_LOGIN = env.bool("TOOLGATE_PASSWORD_LOGIN", default=True)
TOOLGATE_PASSWORD_LOGIN_USERS: list[str] = env.list("TOOLGATE_PASSWORD_LOGIN_USERS", default=[])
SOCIALACCOUNT_PROVIDERS: dict[str, Any] = {
    "openid_connect": {
        "OAUTH_PKCE_ENABLED": True,
        "APPS": [
            {
                "provider_id": "sso",
                "name": TOOLGATE_OIDC_NAME,
                "client_id": env.str("TOOLGATE_OIDC_CLIENT_ID", default=""),
                "secret": env.str("TOOLGATE_OIDC_CLIENT_SECRET", default=""),
                "settings": {
                    "server_url": TOOLGATE_OIDC_SERVER_URL,
                    "scope": env.list(
                        "TOOLGATE_OIDC_SCOPES", default=["openid", "profile", "email", "groups"]
                    ),
                },
            }
        ]
        if TOOLGATE_OIDC_SERVER_URL
        else [],
    }
}

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# The site's own files and the vendored ones (static/vendor/: Pico CSS and htmx, each with its
# version and licence; no CDN).
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Tool calls are small JSON bodies; a larger one is refused before it is parsed.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=64 * 1024)
TOOLGATE_MAX_BODY_BYTES = DATA_UPLOAD_MAX_MEMORY_SIZE
# The model's arguments alone, within the body: what stage 2 of the pipeline accepts.
TOOLGATE_MAX_ARGUMENT_BYTES = env.int("TOOLGATE_MAX_ARGUMENT_BYTES", default=8 * 1024)

# Requests per agent token, such as "6000/min"; dispatch.authentication.AgentRateThrottle reads it.
TOOLGATE_AGENT_THROTTLE_RATE = env("AGENT_THROTTLE_RATE", default="6000/min")
# Failed authentications (401s) per client address, such as "20/min", read through the trusted-
# proxy rule; past it, requests of that address with an unknown token are answered 429 unread
# (dispatch.auth_failures).
TOOLGATE_AUTH_FAILURE_RATE = env("AUTH_FAILURE_RATE", default="20/min")

REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Each view names its own authentication: agent hosts and browsers authenticate differently.
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "EXCEPTION_HANDLER": "dispatch.errors.api_exception_handler",
    # `?format=` names a tool format (docs/api.md, the agent API's `/tools`), not a renderer.
    "URL_FORMAT_OVERRIDE": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Toolgate API",
    "VERSION": "1.0.0",
    "DESCRIPTION": (
        "The model proposes; Toolgate decides. Agent hosts send the raw tool calls their "
        "models produce; every call is validated, authorised, de-duplicated, checked against "
        "live state, held for a human where the risk calls for it, executed and recorded."
    ),
    "SERVE_INCLUDE_SCHEMA": False,
    # 3.1 is JSON Schema proper, which is what the pydantic declarations produce.
    "OAS_VERSION": "3.1.0",
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    # Served from the sidecar package, so the docs work without reaching a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The agent API's examples, each a real request and the answer it got.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "toolgate.api_examples.examples_add",
    ],
}

# An empty broker means no Redis: tasks run in-process, and their errors surface to the caller.
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="")
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = CELERY_TASK_ALWAYS_EAGER
if not CELERY_BROKER_URL:
    # Keeps Celery from falling back to its default AMQP broker on localhost.
    CELERY_BROKER_URL = "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = TIME_ZONE
# Expire held calls that no reviewer decided in time (reading one past its expiry already shows
# it expired; this makes it so for the queue and the counts).
CELERY_BEAT_SCHEDULE = {
    "expire-confirmations": {
        "task": "approvals.tasks.confirmations_expire_task",
        "schedule": env.float("CONFIRMATION_EXPIRY_SECONDS", default=60.0),
    },
    # Approved executions that no worker took (the broker was down, a worker died) are sent again.
    "resend-executions": {
        "task": "approvals.tasks.executions_resend_task",
        "schedule": env.float("TOOLGATE_EXECUTION_SWEEP_SECONDS", default=20.0),
    },
    # So are webhook deliveries whose task was lost; one waiting for its retry is left alone.
    "resend-webhooks": {
        "task": "approvals.webhooks.webhooks_resend_task",
        "schedule": env.float("TOOLGATE_EXECUTION_SWEEP_SECONDS", default=20.0),
    },
    # Notifications whose task was lost are sent again; undecided calls are escalated.
    "sweep-notifications": {
        "task": "approvals.notifications.notifications_sweep_task",
        "schedule": env.float("TOOLGATE_NOTIFY_SWEEP_SECONDS", default=30.0),
    },
    # The managers' rollups, filled from the audit records and the event log (analytics/fills.py).
    # The heads of the audit chains, sealed and written out (dispatch/audit.py).
    "seal-audit": {
        "task": "dispatch.tasks.audit_seal_task",
        "schedule": env.float("TOOLGATE_AUDIT_SEAL_SECONDS", default=300.0),
    },
    "fill-rollups": {
        "task": "analytics.tasks.rollups_fill_task",
        "schedule": env.float("TOOLGATE_ROLLUP_FILL_SECONDS", default=60.0),
    },
    # Idempotency records and sessions past their keep time, deleted in batches
    # (dispatch/retention.py).
    "prune-records": {
        "task": "dispatch.tasks.records_prune_task",
        "schedule": env.float("TOOLGATE_RETENTION_SECONDS", default=3600.0),
    },
    # Direct calls whose outcome is unknown, or whose process died during the upstream's call,
    # settled by their tool's read (dispatch/outcomes.py): two workers at once settle each once.
    "settle-outcomes": {
        "task": "dispatch.tasks.outcomes_settle_task",
        "schedule": env.float("TOOLGATE_OUTCOMES_SETTLE_SECONDS", default=60.0),
    },
    # The books checked over what changed since the last runs, and in full now and then: a
    # tampering UPDATE leaves nothing new to follow (books/reconciler.py).
    "check-books": {
        "task": "books.tasks.books_check_task",
        "schedule": env.float("TOOLGATE_BOOKS_CHECK_SECONDS", default=300.0),
    },
    "sweep-books": {
        "task": "books.tasks.books_check_task",
        "schedule": env.float("TOOLGATE_BOOKS_SWEEP_SECONDS", default=24 * 3600.0),
        "kwargs": {"full": True},
    },
}
# settle-outcomes settles a key left unknown (or in progress past its lease) this long ago: longer
# than an agent's own retry of the same call takes, which settles it first.
TOOLGATE_OUTCOMES_OLDER_THAN_SECONDS = env.float(
    "TOOLGATE_OUTCOMES_OLDER_THAN_SECONDS", default=120.0
)
# A fill counts the calls and decisions that arrived longer ago than this: any later one may still
# be committing. Keep it above the longest a call runs (gunicorn's timeout, 30 s, ends the others).
TOOLGATE_ROLLUP_LAG_SECONDS = env.float("TOOLGATE_ROLLUP_LAG_SECONDS", default=60.0)
# An approved confirmation is the outbox of its execution: not claimed by a worker this long after
# its approval (or its last sending), it is sent again. A worker holds the one it executes under a
# lease that it renews every third of it; a lease that lapsed (the worker died) is taken over.
# The currencies a policy's flat thresholds apply to, where a policy is given one set of numbers
# (`create_agent` without per-currency values, the tests): in each, in its own minor units.
TOOLGATE_POLICY_CURRENCIES = env.list("TOOLGATE_POLICY_CURRENCIES", default=["BRL", "USD", "EUR"])
TOOLGATE_EXECUTION_RESEND_SECONDS = env.int("TOOLGATE_EXECUTION_RESEND_SECONDS", default=60)
TOOLGATE_EXECUTION_LEASE_SECONDS = env.int("TOOLGATE_EXECUTION_LEASE_SECONDS", default=30)
# Sending a task gives up after a few quick tries rather than hold a reviewer's request while the
# broker is away: the approval is kept, and the resend sends it once the broker is back.
CELERY_TASK_PUBLISH_RETRY = True
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0.2,
    "interval_step": 0.3,
    "interval_max": 0.5,
}
# A task is acknowledged once it ran (acks_late): one whose worker was killed goes back to the
# queue once Redis has not heard of it for this long, and another worker runs it. It must stay
# above the longest a task may run or wait for its countdown (a webhook's retry backoff, the
# execution's retries), or a task still running would be run a second time meanwhile.
CELERY_VISIBILITY_TIMEOUT_SECONDS = env.int("CELERY_VISIBILITY_TIMEOUT_SECONDS", default=3600)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": CELERY_VISIBILITY_TIMEOUT_SECONDS,
    # How often a worker looks for such tasks: a quarter of the timeout, at most once a minute.
    "unacked_restore_interval": max(1, min(60, CELERY_VISIBILITY_TIMEOUT_SECONDS // 4)),
    "unacked_restore_throttle": 1,
    # A broker that does not answer is given up on quickly (the publish retry policy above).
    "socket_connect_timeout": 2,
    "max_retries": 2,
    "interval_start": 0.2,
    "interval_step": 0.3,
    "interval_max": 0.5,
}
# Task modules outside an app's tasks.py.
CELERY_IMPORTS = ["approvals.webhooks", "approvals.notifications", "approvals.slack"]

# Webhooks (approvals.webhooks): URLs must resolve to public addresses unless this allows
# loopback and private ones (a receiver on the same host or network).
TOOLGATE_WEBHOOK_ALLOW_PRIVATE = env.bool("TOOLGATE_WEBHOOK_ALLOW_PRIVATE", default=False)
TOOLGATE_WEBHOOK_TIMEOUT_SECONDS = env.float("TOOLGATE_WEBHOOK_TIMEOUT_SECONDS", default=5.0)
TOOLGATE_WEBHOOK_MAX_ATTEMPTS = env.int("TOOLGATE_WEBHOOK_MAX_ATTEMPTS", default=8)
# The wait after the n-th failed attempt is base * 2**(n-1), at most the cap: with the defaults
# 10 s, 20 s, ... 10 min, about 21 minutes over 8 attempts.
TOOLGATE_WEBHOOK_RETRY_BASE_SECONDS = env.float("TOOLGATE_WEBHOOK_RETRY_BASE_SECONDS", default=10.0)
TOOLGATE_WEBHOOK_RETRY_MAX_SECONDS = env.float("TOOLGATE_WEBHOOK_RETRY_MAX_SECONDS", default=600.0)

# Notifications of held calls (approvals/notifications.py, docs/notifications.md). Links in
# messages start with the site's public address.
TOOLGATE_SITE_URL = env("TOOLGATE_SITE_URL", default="http://127.0.0.1:8000")
# E-mail through Django's SMTP backend; the password comes from the environment only.
TOOLGATE_NOTIFY_EMAIL = env.bool("TOOLGATE_NOTIFY_EMAIL", default=False)
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="toolgate@localhost")
# A signed e-mail link opens its card for its reviewer until the call expires, at most this long.
TOOLGATE_MAIL_LINK_MAX_AGE_SECONDS = env.int(
    "TOOLGATE_MAIL_LINK_MAX_AGE_SECONDS", default=7 * 86400
)
# Slack: the bot's token (chat:write) and the app's signing secret, from the environment only; the
# workspace whose requests are accepted (team id), and the channel held calls go to by default.
SLACK_BOT_TOKEN = env("SLACK_BOT_TOKEN", default="")
SLACK_SIGNING_SECRET = env("SLACK_SIGNING_SECRET", default="")
TOOLGATE_SLACK_TEAM_ID = env("TOOLGATE_SLACK_TEAM_ID", default="")
TOOLGATE_SLACK_CHANNEL = env("TOOLGATE_SLACK_CHANNEL", default="")
TOOLGATE_SLACK_API_URL = env("TOOLGATE_SLACK_API_URL", default="https://slack.com/api/")
TOOLGATE_SLACK_TIMEOUT_SECONDS = env.int("TOOLGATE_SLACK_TIMEOUT_SECONDS", default=10)
# How long a one-time code that links a reviewer's Slack user stays valid.
TOOLGATE_SLACK_LINK_CODE_MINUTES = env.int("TOOLGATE_SLACK_LINK_CODE_MINUTES", default=10)
# Each notification is tried this many times, waiting base * 2**(n-1) seconds (capped) between.
TOOLGATE_NOTIFY_MAX_ATTEMPTS = env.int("TOOLGATE_NOTIFY_MAX_ATTEMPTS", default=8)
TOOLGATE_NOTIFY_RETRY_BASE_SECONDS = env.float("TOOLGATE_NOTIFY_RETRY_BASE_SECONDS", default=10.0)
TOOLGATE_NOTIFY_RETRY_MAX_SECONDS = env.float("TOOLGATE_NOTIFY_RETRY_MAX_SECONDS", default=600.0)
# Escalation, where an agent has no NotificationRule of its own: undecided this many minutes
# after the hold, the group is told; and everyone once more this many minutes before expiry.
TOOLGATE_NOTIFY_ESCALATE_AFTER_MINUTES = env.int(
    "TOOLGATE_NOTIFY_ESCALATE_AFTER_MINUTES", default=None
)
TOOLGATE_NOTIFY_ESCALATE_GROUP = env("TOOLGATE_NOTIFY_ESCALATE_GROUP", default="")
TOOLGATE_NOTIFY_REMIND_BEFORE_EXPIRY_MINUTES = env.int(
    "TOOLGATE_NOTIFY_REMIND_BEFORE_EXPIRY_MINUTES", default=None
)

LOG_LEVEL = env("LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "django.db.backends": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        # The audit's seals, when the log is one of their sinks: always written, whatever the level.
        "toolgate.audit.seal": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

# The audit's seals (dispatch/audit.py): how often the heads of the audit chains that moved are
# sealed, and where each seal is written out, where the database's owner cannot rewrite it: "log"
# (the line above, for a log shipped off the host), "file:<path>" (JSON lines appended; verify_audit
# --seals reads them), or an http(s) URL (POSTed, signed with the secret as webhooks are).
TOOLGATE_AUDIT_SEAL_SECONDS = env.float("TOOLGATE_AUDIT_SEAL_SECONDS", default=300.0)
TOOLGATE_AUDIT_SEAL_SINKS = env.list("TOOLGATE_AUDIT_SEAL_SINKS", default=["log"])
TOOLGATE_AUDIT_SEAL_WEBHOOK_SECRET = env("TOOLGATE_AUDIT_SEAL_WEBHOOK_SECRET", default="")
# A seal takes the chains that moved since this long before the previous seal: above the longest
# a call runs (gunicorn's timeout, 30 s), so that a head moved late is never left out.
TOOLGATE_AUDIT_SEAL_OVERLAP_SECONDS = env.float(
    "TOOLGATE_AUDIT_SEAL_OVERLAP_SECONDS", default=300.0
)
for _sink in TOOLGATE_AUDIT_SEAL_SINKS:
    if _sink != "log" and not _sink.startswith(("file:", "https://", "http://")):
        raise ImproperlyConfigured(
            f"TOOLGATE_AUDIT_SEAL_SINKS: {_sink!r} is not log, file:<path> or an http(s) URL"
        )

# The audit chains' keys (docs/audit.md): each link carries an HMAC of its hash made with the
# first key; any of them verifies, so that a key rotated out still vouches for what it signed.
# Never stored in the database: TOOLGATE_AUDIT_KEYS ("id:secret,id:secret", newest first) or a
# file TOOLGATE_AUDIT_KEYS_FILE names (one id:secret a line, newest first). Production refuses to
# start without one (toolgate/settings/production.py); a DEBUG site without one uses
# DEVELOPMENT_AUDIT_KEY, which everyone can read here.
AUDIT_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
AUDIT_KEY_MIN_LENGTH = 32
DEVELOPMENT_AUDIT_KEY = "dev:development-audit-key-known-to-everyone-never-in-production"


def audit_keys(entries: list[str]) -> list[str]:
    """The keys as `id:secret` entries, checked: each id once, each secret long enough."""
    seen: set[str] = set()
    for entry in entries:
        key_id, _, secret = entry.partition(":")
        if not AUDIT_KEY_ID.fullmatch(key_id) or len(secret) < AUDIT_KEY_MIN_LENGTH:
            raise ImproperlyConfigured(
                f"audit key {key_id!r}: give it as id:secret, the id letters, digits, - or _ (at "
                f"most 32), the secret at least {AUDIT_KEY_MIN_LENGTH} characters"
            )
        if key_id in seen:
            raise ImproperlyConfigured(f"audit key {key_id!r} is given twice")
        seen.add(key_id)
    return entries


TOOLGATE_AUDIT_KEYS_FILE = env("TOOLGATE_AUDIT_KEYS_FILE", default="")
if TOOLGATE_AUDIT_KEYS_FILE:
    try:
        with open(TOOLGATE_AUDIT_KEYS_FILE, encoding="utf-8") as _keys:
            _entries = [line.strip() for line in _keys if line.strip()]
    except OSError as _error:
        raise ImproperlyConfigured(f"TOOLGATE_AUDIT_KEYS_FILE: {_error}") from _error
else:
    _entries = env.list("TOOLGATE_AUDIT_KEYS", default=[])
TOOLGATE_AUDIT_KEYS: list[str] = audit_keys(_entries)

# The refund gateway's fault switch (orders.models.GatewayFault): read only where failures are
# demonstrated on purpose; production turns it off.
TOOLGATE_GATEWAY_FAULTS = env.bool("TOOLGATE_GATEWAY_FAULTS", default=True)
# The declarations modules of the upstreams whose tools Toolgate serves (docs/upstreams.md):
# code in the repository; their addresses and credentials come from the environment.
TOOLGATE_UPSTREAMS = env.list("TOOLGATE_UPSTREAMS", default=[])
# Tools retired beside their declarations' own `retired` (docs/tools.md, "Versions and
# retirement"): no longer listed, a call refused as TOOL_RETIRED; a name no tool has stops start-up.
TOOLGATE_RETIRED_TOOLS = env.list("TOOLGATE_RETIRED_TOOLS", default=[])

# Connections each process keeps for reserving money where a policy caps an agent's day
# (PostgreSQL only; other reservations are made in the call's own transaction).
TOOLGATE_RESERVATION_CONNECTIONS = env.int("TOOLGATE_RESERVATION_CONNECTIONS", default=4)

# Managers' requests (the pages under /analytics/, the API under /api/v1/metrics) that may run at
# once across the site, and the seconds each of their statements (and the what-if's replay) may
# take: a report never holds the web processes the agents need (analytics/heavy.py). Keep the
# slots below gunicorn's workers, and the seconds well below its timeout.
TOOLGATE_MANAGER_SLOTS = env.int("TOOLGATE_MANAGER_SLOTS", default=1)
TOOLGATE_MANAGER_TIMEOUT_SECONDS = env.float("TOOLGATE_MANAGER_TIMEOUT_SECONDS", default=10.0)

# The most calls the dashboard's CSV holds: a range with more is refused before anything is sent,
# with a word to narrow it.
TOOLGATE_CSV_MAX_ROWS = env.int("TOOLGATE_CSV_MAX_ROWS", default=100_000)

# The reviewer queue reloads itself this often; an item approved or executing for longer than
# TOOLGATE_STUCK_AFTER_MINUTES stands out (a worker that is down), as does a pending one that
# expires within TOOLGATE_EXPIRING_SOON_MINUTES.
TOOLGATE_QUEUE_REFRESH_SECONDS = env.int("TOOLGATE_QUEUE_REFRESH_SECONDS", default=10)
TOOLGATE_STUCK_AFTER_MINUTES = env.int("TOOLGATE_STUCK_AFTER_MINUTES", default=5)
TOOLGATE_EXPIRING_SOON_MINUTES = env.int("TOOLGATE_EXPIRING_SOON_MINUTES", default=15)

# How many simulated sessions `seed_demo` spreads over the last 30 days for the dashboards.
TOOLGATE_DEMO_HISTORY_SESSIONS = env.int("TOOLGATE_DEMO_HISTORY_SESSIONS", default=600)

# Refused requests of the agent API are kept this many days, and at most this many rows
# (dispatch.security prunes on write and with `manage.py prune_security_events`).
TOOLGATE_SECURITY_EVENTS_RETENTION_DAYS = env.int(
    "TOOLGATE_SECURITY_EVENTS_RETENTION_DAYS", default=30
)
TOOLGATE_SECURITY_EVENTS_MAX_ROWS = env.int("TOOLGATE_SECURITY_EVENTS_MAX_ROWS", default=100_000)

# An agent host's Idempotency-Key gets its first answer again for this many hours (at least 24,
# as hosts are promised); dispatch.host_keys prunes older keys on write and with
# `manage.py prune_idempotency_keys`.
TOOLGATE_IDEMPOTENCY_KEY_HOURS = env.int("TOOLGATE_IDEMPOTENCY_KEY_HOURS", default=24)
# A key whose run has held it this long belongs to a process that died (a web worker killed, its
# database connection cut before it could free the key): the next request with it runs instead of
# getting 409. Keep it above gunicorn's timeout, the longest a request runs.
TOOLGATE_IDEMPOTENCY_TAKE_OVER_SECONDS = env.int(
    "TOOLGATE_IDEMPOTENCY_TAKE_OVER_SECONDS", default=60
)
if TOOLGATE_IDEMPOTENCY_KEY_HOURS < 24:
    raise ImproperlyConfigured(
        "TOOLGATE_IDEMPOTENCY_KEY_HOURS must be at least 24: agent hosts are promised that a key "
        "gets its first answer again for a day."
    )

# The pipeline's own records of a call (docs/retention.md): an idempotency record is kept this
# long after it last moved, a session this long after its last call; beat's retention deletes
# them afterwards (dispatch/retention.py), never a key whose effect may yet happen. Neither may go
# below a day, nor below TOOLGATE_IDEMPOTENCY_KEY_HOURS: a host's unfinished key runs again in the
# session of its first request, under that session's key.
TOOLGATE_IDEMPOTENCY_KEEP_SECONDS = env.int(
    "TOOLGATE_IDEMPOTENCY_KEEP_SECONDS", default=7 * 24 * 3600
)
TOOLGATE_SESSION_KEEP_SECONDS = env.int("TOOLGATE_SESSION_KEEP_SECONDS", default=7 * 24 * 3600)
# Rows one statement of the retention deletes at most: each batch is a short transaction.
TOOLGATE_RETENTION_BATCH = env.int("TOOLGATE_RETENTION_BATCH", default=5000)
for _name, _seconds in (
    ("TOOLGATE_IDEMPOTENCY_KEEP_SECONDS", TOOLGATE_IDEMPOTENCY_KEEP_SECONDS),
    ("TOOLGATE_SESSION_KEEP_SECONDS", TOOLGATE_SESSION_KEEP_SECONDS),
):
    if _seconds < max(24, TOOLGATE_IDEMPOTENCY_KEY_HOURS) * 3600:
        raise ImproperlyConfigured(
            f"{_name} must be at least a day and at least TOOLGATE_IDEMPOTENCY_KEY_HOURS "
            f"({TOOLGATE_IDEMPOTENCY_KEY_HOURS} h), not {_seconds} s: an identical call is "
            "promised the first answer for a day, and a host's key runs again in its session."
        )
del _name, _seconds
if TOOLGATE_RETENTION_BATCH < 1:
    raise ImproperlyConfigured("TOOLGATE_RETENTION_BATCH must be at least 1")
