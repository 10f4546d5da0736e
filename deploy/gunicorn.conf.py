"""gunicorn behind nginx: `gunicorn -c deploy/gunicorn.conf.py toolgate.wsgi` (docs/deploy.md).

nginx (deploy/nginx/toolgate.conf) reads each request whole before passing it on, so a sync
worker is busy only while Django works, never while a slow client sends.
"""

import os

# Loopback only: Django trusts X-Forwarded-Proto, which nothing but nginx may set.
bind = [os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")]
# gunicorn's usual advice is 2 x cores + 1.
workers = int(os.environ.get("WEB_CONCURRENCY", "3"))
worker_class = "sync"
# A request still running after this has its worker restarted; nginx waits a little longer.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = 30
accesslog = "-"
