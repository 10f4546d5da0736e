"""One production site for this folder's tests, built step by step as docs/deploy.md gives it.

It is taken down when they are done (package scope), so that its processes and their database
connections are gone before the rest of the suite runs.

Each fixture adds a step and needs what the step needs: `site` PostgreSQL, `site_app`
Redis too (gunicorn is a dependency of the project), `site_proxy` nginx and openssl too. Without
one, the tests that need it are skipped with the reason (failed under TOOLGATE_REQUIRE_SERVICES=1).
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import redis

from tests.conftest import AgentClient, printed_token
from tests.deploy.site import (
    DIRECT_HEADERS,
    REDIS_URL,
    Cluster,
    Production,
    Proxy,
    Service,
    SiteDatabase,
    free_port,
    nginx_binary,
    nginx_start,
)
from tests.services import unavailable

# Sync workers, as in production; the slow-client tests open more slow sockets than this.
WORKERS = 3
# The managers' own (docs/deploy.md): one runs a report, the other says the slot is taken.
MANAGER_WORKERS = 2


@dataclass
class Site:
    database: SiteDatabase
    production: Production
    token: str


@dataclass
class App:
    site: Site
    gunicorn: Service
    port: int
    workers: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> AgentClient:
        """An agent host talking to gunicorn directly, as nginx would."""
        client = AgentClient(self.url, self.site.token)
        client.http.headers.update(DIRECT_HEADERS)
        return client


@pytest.fixture(scope="package")
def site_directory() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="toolgate-site-"))
    # nginx's workers (www-data when the tests run as root) read the static files inside it.
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="package")
def site(site_directory: Path) -> Iterator[Site]:
    """Roles and database, migrate as the owner, db_roles (docs/deploy.md, steps 2 and 3), and
    an agent (step 9)."""
    cluster = Cluster.from_environment()
    if cluster is None:
        unavailable("needs PostgreSQL: DATABASE_URL is not a postgres:// URL")
    database = SiteDatabase.for_cluster(cluster)
    try:
        database.create()
    except psycopg.errors.InsufficientPrivilege:
        unavailable(f"needs a PostgreSQL role that creates roles and databases, not {cluster.user}")
    production = Production(database=database, directory=site_directory, https_port=free_port())
    try:
        production.manage("migrate", "--noinput")
        production.manage("db_roles", "--app-role", database.app)
        output = production.manage(
            "create_agent",
            "site-agent",
            "--tools",
            "get_order",
            "refund_order",
            "--auto-approve-below",
            "BRL:50",
            "USD:50",
            "EUR:50",
        )
        yield Site(database=database, production=production, token=printed_token(output))
    finally:
        database.drop()


@pytest.fixture(scope="package")
def site_app(site: Site) -> Iterator[App]:
    """collectstatic, then gunicorn on the production settings as the application role."""
    if importlib.util.find_spec("gunicorn") is None:
        unavailable("needs gunicorn")
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError:
        unavailable(f"needs Redis at {REDIS_URL}: the production cache and broker")
    site.production.manage("collectstatic", "--noinput")
    # Readable by nginx's workers whatever the umask, as docs/deploy.md asks of STATIC_ROOT.
    subprocess.run(["chmod", "-R", "a+rX", str(site.production.static_root)], check=True)
    port = free_port()
    gunicorn = site.production.gunicorn(port=port, workers=WORKERS)
    try:
        yield App(site=site, gunicorn=gunicorn, port=port, workers=WORKERS)
    finally:
        # SIGINT is gunicorn's quick shutdown: its workers do not finish what they hold.
        gunicorn.stop(signal.SIGINT)


@pytest.fixture(scope="package")
def site_managers(site_app: App) -> Iterator[App]:
    """The managers' web processes: a second gunicorn at a lower CPU priority (docs/deploy.md,
    step 7)."""
    port = free_port()
    gunicorn = site_app.site.production.gunicorn(
        port=port, workers=MANAGER_WORKERS, name="gunicorn-managers", nice=10
    )
    try:
        yield App(site=site_app.site, gunicorn=gunicorn, port=port, workers=MANAGER_WORKERS)
    finally:
        gunicorn.stop(signal.SIGINT)


@pytest.fixture(scope="package")
def site_proxy(site_app: App, site_managers: App, site_directory: Path) -> Iterator[Proxy]:
    """nginx in front, terminating TLS with a self-signed certificate made for the purpose."""
    if nginx_binary() is None:
        unavailable("needs nginx (Debian's package: apt-get install nginx)")
    if shutil.which("openssl") is None:
        unavailable("needs openssl, to make a certificate")
    proxy = nginx_start(
        directory=site_directory,
        upstream_port=site_app.port,
        https_port=site_app.site.production.https_port,
        static_root=site_app.site.production.static_root,
        managers_port=site_managers.port,
    )
    try:
        yield proxy
    finally:
        proxy.service.stop(signal.SIGTERM)


@pytest.fixture
def proxy_client(site_app: App, site_proxy: Proxy) -> Iterator[AgentClient]:
    """An agent host talking to nginx over TLS, trusting the certificate made for the site."""
    client = AgentClient(site_proxy.url, site_app.site.token)
    client.http.verify = str(site_proxy.certificate)
    # Otherwise REQUESTS_CA_BUNDLE, where set, would be trusted instead of the certificate.
    client.http.trust_env = False
    yield client
    client.http.close()
