"""A production site on this machine, built in the order docs/deploy.md gives.

The environment files of its step 1, read from the page itself (the site's own values where the
page has placeholders, the page's where it has none, so that a setting the page drops is dropped
here too), PostgreSQL roles and a database of its own, every command as the role the page's table
names for it, `migrate` as the owner, `db_roles`, `collectstatic` into a temporary STATIC_ROOT,
gunicorn on the production settings with its unit's own settings, and nginx in front with
deploy/nginx/toolgate.conf and a self-signed certificate made for the purpose. Every process is
started here and stopped by its own pid; everything listens on 127.0.0.1.
"""

from __future__ import annotations

import itertools
import os
import pwd
import random
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import IO, Any

import environ
import psycopg
import requests

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
NGINX_SITE = ROOT / "deploy" / "nginx" / "toolgate.conf"
GUNICORN_CONF = ROOT / "deploy" / "gunicorn.conf.py"
SERVER_NAME = "localhost"
REDIS_URL = os.environ.get("TOOLGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/3")
STARTUP_SECONDS = 60

_handed_out: set[int] = set()


def free_port() -> int:
    """A free loopback port: from TOOLGATE_TEST_PORTS ("18300-18399") if set, else any."""
    span = os.environ.get("TOOLGATE_TEST_PORTS", "")
    if span:
        low, high = (int(part) for part in span.split("-"))
        candidates = random.sample(range(low, high + 1), high - low + 1)
    else:
        candidates = [0] * 20
    for candidate in candidates:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            port = int(probe.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 (TOOLGATE_TEST_PORTS={span!r})")


def wait_until(ready: Callable[[], bool], *, what: str, process: Service | None = None) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process is not None and not process.alive():
            raise RuntimeError(f"{what} exited:\n{process.log_tail()}")
        if ready():
            return
        time.sleep(0.2)
    tail = process.log_tail() if process is not None else ""
    raise RuntimeError(f"{what} not ready after {STARTUP_SECONDS} s\n{tail}")


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Service:
    """A long-running process started for the tests, its output in a log file."""

    def __init__(self, name: str, args: Sequence[str], *, env: Mapping[str, str], log: Path):
        self.name = name
        self.log = log
        self._log_file: IO[bytes] = log.open("ab")
        self.process = subprocess.Popen(
            list(args), cwd=ROOT, env=dict(env), stdout=self._log_file, stderr=subprocess.STDOUT
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, how: signal.Signals = signal.SIGTERM) -> None:
        if self.alive():
            self.process.send_signal(how)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)
        self._log_file.close()


@dataclass(frozen=True)
class Cluster:
    """The PostgreSQL server of DATABASE_URL, reached as its (super)user to create roles."""

    host: str
    port: int
    user: str
    password: str
    name: str

    @classmethod
    def from_environment(cls) -> Cluster | None:
        url = os.environ.get("DATABASE_URL", "")
        if not url.startswith(("postgres://", "postgresql://")):
            return None
        config = environ.Env.db_url_config(url)
        return cls(
            host=config.get("HOST") or "127.0.0.1",
            port=int(config.get("PORT") or 5432),
            user=config.get("USER") or "postgres",
            password=config.get("PASSWORD") or "",
            name=config["NAME"],
        )

    def connect(
        self, database: str = "postgres", *, role: str | None = None, password: str = ""
    ) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host=self.host,
            port=self.port,
            user=role or self.user,
            password=(password if role else self.password) or None,
            dbname=database,
            autocommit=True,
            connect_timeout=10,
        )


@dataclass
class SiteDatabase:
    """A database of its own, owned by one role and used by another (docs/deploy.md, step 1)."""

    cluster: Cluster
    name: str
    owner: str
    app: str
    password: str = field(default_factory=lambda: secrets.token_hex(16))
    _orders: itertools.count[int] = field(default_factory=lambda: itertools.count(5001))

    @classmethod
    def for_cluster(cls, cluster: Cluster) -> SiteDatabase:
        # Named after DATABASE_URL's database, so that runs on one server do not collide.
        base = f"{cluster.name}_site"
        return cls(cluster=cluster, name=base, owner=f"{base}_owner", app=f"{base}_app")

    def url(self, role: str) -> str:
        c = self.cluster
        return f"postgres://{role}:{self.password}@{c.host}:{c.port}/{self.name}"

    def connect(self, role: str) -> psycopg.Connection[Any]:
        return self.cluster.connect(self.name, role=role, password=self.password)

    def create(self) -> None:
        from psycopg import sql

        with self.cluster.connect() as admin:
            self._drop(admin)
            for role in (self.owner, self.app):
                admin.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(role), sql.Literal(self.password)
                    )
                )
            admin.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(self.name), sql.Identifier(self.owner)
                )
            )
            admin.execute(
                sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(self.name))
            )

    def drop(self) -> None:
        with self.cluster.connect() as admin:
            self._drop(admin)

    def _drop(self, admin: psycopg.Connection[Any]) -> None:
        from psycopg import sql

        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
        )
        for role in (self.app, self.owner):
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))

    def order_create(self, *, total_cents: int = 12_000, customer_id: str = "CUS-1") -> str:
        """An order, written as the application role (as the admin does); returns its id."""
        order_id = f"ORD-{next(self._orders)}"
        with self.connect(self.app) as connection:
            connection.execute(
                "INSERT INTO orders_order (order_id, customer_id, total_cents, currency, "
                "refunded_cents, created_at) VALUES (%s, %s, %s, 'BRL', 0, now())",
                [order_id, customer_id, total_cents],
            )
        return order_id

    def ledger(self, order_id: str) -> tuple[int, int, int]:
        """(ledger rows, their sum, refunded_cents) of an order, read as the owner."""
        with self.connect(self.owner) as connection:
            row = connection.execute(
                "SELECT count(r.id), coalesce(sum(r.amount_cents), 0), o.refunded_cents "
                "FROM orders_order o LEFT JOIN orders_refund r ON r.order_id = o.id "
                "WHERE o.order_id = %s GROUP BY o.refunded_cents",
                [order_id],
            ).fetchone()
        assert row is not None, order_id
        return int(row[0]), int(row[1]), int(row[2])

    def audit_codes(self, session_id: str) -> list[str]:
        with self.connect(self.owner) as connection:
            rows = connection.execute(
                "SELECT code FROM dispatch_auditrecord WHERE session_id = %s ORDER BY id",
                [session_id],
            ).fetchall()
        return [code for (code,) in rows]


# docs/deploy.md, step 1 ---------------------------------------------------------------------


def _step_one() -> str:
    text = DEPLOY_DOC.read_text()
    start = text.index("\n## 1. ")
    return text[start : text.index("\n## ", start + 1)]


def _assignments(block: str) -> dict[str, str]:
    """KEY=VALUE lines, as `set -a; . file` reads them (comments and blanks left out)."""
    values = {}
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            values[key] = value
    return values


def doc_environment() -> tuple[dict[str, str], dict[str, str]]:
    """The shared environment file and the owner's, as docs/deploy.md's step 1 gives them."""
    blocks = re.findall(r"```sh\n(.*?)```", _step_one(), flags=re.DOTALL)
    shared, owner = (_assignments(block) for block in blocks[:2])
    return shared, owner


def doc_roles() -> dict[str, str]:
    """What each command runs as ("owner" or "app"), from the table of docs/deploy.md's step 1:
    `migrate`, `gunicorn`, `celery worker`, `mcp_serve`, ..."""
    roles = {}
    for row in re.findall(r"^\|(.+)\|$", _step_one(), flags=re.MULTILINE):
        what, runs_as, *_ = (cell.strip() for cell in row.split("|"))
        if runs_as not in ("owner", "app"):
            continue
        names = [span.removeprefix("manage.py ").split() for span in re.findall(r"`([^`]+)`", what)]
        for words in names:
            name = " ".join(words[:2]) if words[0] == "celery" else words[0]
            roles[name] = runs_as
        if what.startswith("gunicorn"):
            roles["gunicorn"] = runs_as
    return roles


class Production:
    """The environment and the commands of the production settings, for one site: two files as
    docs/deploy.md's step 1 writes them, the shared one and the owner's, and each command with the
    role the page gives it."""

    # Per unit, never in the shared file (docs/deploy.md, step 1).
    UNIT_SETTINGS = ("GUNICORN_BIND", "WEB_CONCURRENCY", "GUNICORN_TIMEOUT")

    def __init__(self, *, database: SiteDatabase, directory: Path, https_port: int):
        self.database = database
        self.directory = directory
        self.static_root = directory / "static"
        self.https_port = https_port
        self.secret_key = secrets.token_urlsafe(50)
        self.audit_key = f"1:{secrets.token_hex(32)}"
        self.env_file = directory / "env"
        self.owner_env_file = directory / "owner-env"
        self._write_env_files()

    def _write_env_files(self) -> None:
        shared, owner = doc_environment()
        # The site's values for the page's placeholders; every other value is the page's own.
        site = {
            "SECRET_KEY": self.secret_key,
            "ALLOWED_HOSTS": SERVER_NAME,
            "CSRF_TRUSTED_ORIGINS": f"https://{SERVER_NAME}:{self.https_port}",
            "DATABASE_URL": self.database.url(self.database.app),
            "CACHE_URL": REDIS_URL,
            "CELERY_BROKER_URL": REDIS_URL,
            "STATIC_ROOT": str(self.static_root),
            "TOOLGATE_AUDIT_KEYS": self.audit_key,
        }
        missing = sorted(set(site) - set(shared))
        assert not missing, f"docs/deploy.md's /etc/toolgate/env no longer sets {missing}"
        assert set(owner) == {"DATABASE_URL"}, owner
        assert not set(self.UNIT_SETTINGS) & set(shared), "a unit's own setting in the shared file"
        self.env_file.write_text("".join(f"{k}={site.get(k, v)}\n" for k, v in shared.items()))
        self.owner_env_file.write_text(f"DATABASE_URL={self.database.url(self.database.owner)}\n")

    def env(self, *, role: str) -> dict[str, str]:
        """This process's environment without the site's settings, then the shared file, then
        the owner's where `role` is the owner (docs/deploy.md, step 1)."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("DJANGO_", "DATABASE_", "CELERY_", "CACHE_", "TOOLGATE_"))
            and key not in self.UNIT_SETTINGS
        }
        env.update(_assignments(self.env_file.read_text()))
        if role == self.database.owner:
            env.update(_assignments(self.owner_env_file.read_text()))
        else:
            assert role == self.database.app, role
        return env

    def role_of(self, command: str) -> str:
        """The database role docs/deploy.md runs the command as."""
        roles = doc_roles()
        assert command in roles, f"docs/deploy.md does not say what {command} runs as"
        return self.database.owner if roles[command] == "owner" else self.database.app

    def env_of(self, command: str) -> dict[str, str]:
        return self.env(role=self.role_of(command))

    def manage(self, *args: str, role: str | None = None, **env: str) -> str:
        """manage.py with the environment of the role docs/deploy.md gives the command (or
        `role`, for what a test runs on purpose as another)."""
        completed = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env={**self.env(role=role or self.role_of(args[0])), **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        if completed.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)}:\n{completed.stdout}{completed.stderr}")
        return completed.stdout

    def gunicorn(
        self,
        *,
        port: int,
        workers: int,
        name: str = "gunicorn",
        nice: int = 0,
        env: Mapping[str, str] | None = None,
    ) -> Service:
        """gunicorn as the doc's unit runs it; `env` is more of its environment (or the settings
        it changes)."""
        environment = self.env_of("gunicorn")
        # The unit's own Environment= line.
        environment.update(GUNICORN_BIND=f"127.0.0.1:{port}", WEB_CONCURRENCY=str(workers))
        environment.update(env or {})
        command = [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF), "toolgate.wsgi"]
        service = Service(
            name,
            # As systemd's Nice= would.
            ["nice", "-n", str(nice), *command] if nice else command,
            env=environment,
            log=self.directory / f"{name}.log",
        )
        url = f"http://127.0.0.1:{port}/accounts/login/"

        def answers() -> bool:
            try:
                return requests.get(url, headers=DIRECT_HEADERS, timeout=5).status_code == 200
            except requests.RequestException:
                return False

        wait_until(answers, what="gunicorn", process=service)
        return service


# What nginx sets on every request it passes on; a test that talks to gunicorn directly sends
# the same, so that the production settings answer it rather than redirect it to HTTPS.
DIRECT_HEADERS = {"Host": SERVER_NAME, "X-Forwarded-Proto": "https"}


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    certificate, key = directory / "localhost.crt", directory / "localhost.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            f"/CN={SERVER_NAME}",
            "-addext",
            f"subjectAltName=DNS:{SERVER_NAME},IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(certificate),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return certificate, key


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (path for path in ("/usr/sbin/nginx",) if os.access(path, os.X_OK)), None
    )


def nginx_site(**values: str) -> str:
    """deploy/nginx/toolgate.conf with its ${TOOLGATE_...} values filled in, as envsubst would."""
    text = Template(NGINX_SITE.read_text()).safe_substitute(values)
    missing = sorted(set(re.findall(r"\$\{(TOOLGATE_\w+)\}", text)))
    if missing:
        raise KeyError(f"no value for {', '.join(missing)}")
    return text


def nginx_main(directory: Path, site: Path) -> str:
    """What Debian's /etc/nginx/nginx.conf does, with every path under `directory`."""
    user = ""
    if os.geteuid() == 0:
        # As root the workers need a user, as Debian's nginx.conf says: www-data.
        try:
            pwd.getpwnam("www-data")
            user = "user www-data;"
        except KeyError:
            user = "user nobody;"
    temp = {kind: directory / f"{kind}_temp" for kind in ("client_body", "proxy")}
    return f"""
{user}
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/nginx-error.log warn;
events {{ worker_connections 512; }}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    sendfile on;
    access_log {directory}/nginx-access.log;
    client_body_temp_path {temp["client_body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {directory}/fastcgi_temp;
    uwsgi_temp_path {directory}/uwsgi_temp;
    scgi_temp_path {directory}/scgi_temp;
    include {site};
}}
"""


@dataclass
class Proxy:
    service: Service
    https_port: int
    http_port: int
    certificate: Path

    @property
    def url(self) -> str:
        return f"https://{SERVER_NAME}:{self.https_port}"

    def tls_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.certificate))


def nginx_start(
    *,
    directory: Path,
    upstream_port: int,
    https_port: int,
    static_root: Path,
    managers_port: int | None = None,
) -> Proxy:
    """nginx with the site; the managers' pages go to `managers_port` (by default, the same
    gunicorn as the rest)."""
    binary = nginx_binary()
    assert binary is not None
    certificate, key = self_signed_certificate(directory)
    http_port = free_port()
    site = directory / "toolgate.conf"
    site.write_text(
        nginx_site(
            TOOLGATE_SERVER_NAME=SERVER_NAME,
            TOOLGATE_HTTP_LISTEN=f"127.0.0.1:{http_port}",
            TOOLGATE_HTTPS_LISTEN=f"127.0.0.1:{https_port}",
            TOOLGATE_UPSTREAM=f"127.0.0.1:{upstream_port}",
            TOOLGATE_MANAGERS_UPSTREAM=f"127.0.0.1:{managers_port or upstream_port}",
            TOOLGATE_STATIC_ROOT=str(static_root),
            TOOLGATE_TLS_CERTIFICATE=str(certificate),
            TOOLGATE_TLS_CERTIFICATE_KEY=str(key),
        )
    )
    main = directory / "nginx.conf"
    main.write_text(nginx_main(directory, site))
    error_log = directory / "nginx-error.log"
    arguments = ["-p", str(directory), "-c", str(main), "-e", str(error_log), "-g", "daemon off;"]
    service = Service("nginx", [binary, *arguments], env=os.environ, log=error_log)
    wait_until(lambda: listening(https_port), what="nginx", process=service)
    return Proxy(
        service=service, https_port=https_port, http_port=http_port, certificate=certificate
    )
