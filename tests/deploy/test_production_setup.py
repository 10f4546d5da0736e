"""docs/deploy.md followed on this machine: every page answers through nginx over TLS.

The site is built by the fixtures in tests/deploy/conftest.py in the order the page gives: roles,
migrate as the owner, db_roles, collectstatic, Redis as cache and broker, gunicorn behind nginx
with deploy/nginx/toolgate.conf, a worker and beat, on the production settings.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from django.conf import settings

from tests.conftest import AgentClient
from tests.deploy.conftest import App
from tests.deploy.site import (
    ROOT,
    SERVER_NAME,
    Proxy,
    Service,
    free_port,
    nginx_start,
    wait_until,
)

PAGES = [
    "/",
    "/accounts/login/",
    "/accounts/password_reset/",
    "/admin/login/",
    "/api/docs/",
    "/api/schema/",
]


@pytest.mark.parametrize("path", PAGES)
def test_each_page_answers_through_nginx_over_tls(proxy_client: AgentClient, path: str) -> None:
    response = proxy_client.http.get(proxy_client.base_url + path, timeout=30)

    assert response.status_code == 200, response.text[:500]
    assert response.url == proxy_client.base_url + path
    # Django saw the request as HTTPS, from the header nginx set.
    assert "max-age=31536000" in response.headers["Strict-Transport-Security"]


@pytest.mark.parametrize("page", ["/admin/login/", "/api/docs/"])
def test_the_static_files_a_page_links_to_are_served_by_nginx(
    proxy_client: AgentClient, page: str
) -> None:
    html = proxy_client.http.get(proxy_client.base_url + page, timeout=30).text
    links = sorted(set(re.findall(r"""["'](/static/[^"'?#]+)""", html)))

    responses = {
        link: proxy_client.http.get(proxy_client.base_url + link, timeout=30) for link in links
    }

    assert links, html[:500]
    assert {link: r.status_code for link, r in responses.items()} == dict.fromkeys(links, 200)
    # nginx's header for hashed names; Django's WhiteNoise would have said it differently.
    assert {r.headers["Cache-Control"] for r in responses.values()} == {
        "public, max-age=31536000, immutable"
    }


def test_an_admin_created_as_the_docs_say_logs_in_through_nginx(
    site_app: App, proxy_client: AgentClient
) -> None:
    site, password = site_app.site, secrets.token_urlsafe(16)
    site.production.manage(
        "createsuperuser",
        "--noinput",
        "--username",
        "site-admin",
        "--email",
        "admin@example.com",
        DJANGO_SUPERUSER_PASSWORD=password,
    )
    login = f"{proxy_client.base_url}/admin/login/"
    browser = proxy_client.http
    browser.get(login, timeout=30)

    response = browser.post(
        login,
        data={
            "username": "site-admin",
            "password": password,
            "next": "/admin/",
            "csrfmiddlewaretoken": browser.cookies["csrftoken"],
        },
        headers={"Referer": login},
        timeout=30,
    )

    assert response.status_code == 200, response.text[:500]
    assert response.url == f"{proxy_client.base_url}/admin/"
    assert "site-admin" in response.text
    assert {cookie.name: cookie.secure for cookie in browser.cookies} == {
        "csrftoken": True,
        "sessionid": True,
    }


def test_an_agent_call_through_nginx_refunds_once(site_app: App, proxy_client: AgentClient) -> None:
    database = site_app.site.database
    order_id = database.order_create(total_cents=9_000, customer_id="CUS-920")

    result = proxy_client.refund(1500, order_id=order_id, session="tls-1", customer="CUS-920")

    assert (result["ok"], result["code"], result["data"]["refunded_cents"]) == (True, "OK", 1500)
    assert database.ledger(order_id) == (1, 1500, 1500)


def test_the_managers_pages_reach_their_own_web_processes_and_the_agents_calls_theirs(
    site_app: App, site_managers: App, proxy_client: AgentClient
) -> None:
    probe = secrets.token_hex(8)
    paths = {
        "manager_page": f"/analytics/?probe={probe}",
        "manager_api": f"/api/v1/metrics?probe={probe}",
        "agent_api": f"/api/v1/sessions/probe-{probe}/calls",
    }

    answers = {
        name: proxy_client.http.get(
            proxy_client.base_url + path, headers=proxy_client.headers(), allow_redirects=False
        )
        for name, path in paths.items()
    }

    assert answers["manager_page"].status_code == 302  # to the login
    assert answers["manager_api"].status_code == 403  # an agent's token opens nothing there
    assert answers["manager_api"].json()["error"]["status"] == 403
    assert answers["agent_api"].status_code == 404  # no such session, from the agents' API
    # Each gunicorn writes its access log as it answers.
    wait_until(
        lambda: (
            paths["agent_api"] in site_app.gunicorn.log_tail(200)
            and paths["manager_api"] in site_managers.gunicorn.log_tail(200)
        ),
        what="the access logs",
    )
    managers_log, agents_log = site_managers.gunicorn.log_tail(200), site_app.gunicorn.log_tail(200)
    assert paths["manager_page"] in managers_log and paths["manager_api"] in managers_log
    assert paths["manager_page"] not in agents_log and paths["manager_api"] not in agents_log
    assert paths["agent_api"] not in managers_log


def test_plain_http_is_sent_to_https(site_proxy: Proxy) -> None:
    response = requests.get(
        f"http://{SERVER_NAME}:{site_proxy.http_port}/admin/login/",
        allow_redirects=False,
        timeout=10,
    )

    assert response.status_code == 301
    assert response.headers["Location"] == f"https://{SERVER_NAME}/admin/login/"


def test_a_request_for_another_name_gets_no_answer(
    site_proxy: Proxy, proxy_client: AgentClient
) -> None:
    with pytest.raises(requests.ConnectionError):
        proxy_client.http.get(
            f"{site_proxy.url}/admin/login/", headers={"Host": "evil.example"}, timeout=10
        )


def test_a_body_over_the_apis_limit_is_refused_by_nginx_in_the_apis_shape(
    proxy_client: AgentClient,
) -> None:
    limit = settings.TOOLGATE_MAX_BODY_BYTES

    response = proxy_client.post_body(b" " * (limit + 1))

    assert response.status_code == 413
    assert response.headers["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "payload_too_large"


def test_a_body_of_exactly_the_apis_limit_reaches_the_api(
    site_app: App, proxy_client: AgentClient
) -> None:
    order_id = site_app.site.database.order_create(customer_id="CUS-921")
    envelope = json.dumps(
        {
            "session_id": "tls-2",
            "customer_id": "CUS-921",
            "tool": "get_order",
            "arguments": {"order_id": order_id},
        }
    )
    body = envelope + " " * (settings.TOOLGATE_MAX_BODY_BYTES - len(envelope))

    response = proxy_client.post_body(body)

    assert response.status_code == 200, response.text[:500]
    assert response.json()["ok"] is True


def celery_command() -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "toolgate"]


@pytest.fixture
def celery_processes(site_app: App) -> Iterator[tuple[Service, Service, str]]:
    """A worker and beat as docs/deploy.md starts them, with the role and the environment it
    gives them."""
    production = site_app.site.production
    name = f"toolgate-test-{secrets.token_hex(4)}@localhost"
    celery = celery_command()
    worker = Service(
        "celery worker",
        [*celery, "worker", "--pool", "solo", "--hostname", name, "--loglevel", "INFO"],
        env=production.env_of("celery worker"),
        log=production.directory / "celery-worker.log",
    )
    beat = Service(
        "celery beat",
        [
            *celery,
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(production.directory / "celerybeat-schedule"),
        ],
        env=production.env_of("celery beat"),
        log=production.directory / "celery-beat.log",
    )
    try:
        yield worker, beat, name
    finally:
        worker.stop(signal.SIGTERM)
        beat.stop(signal.SIGTERM)


def test_the_worker_and_beat_run_on_the_production_settings(
    site_app: App, celery_processes: tuple[Service, Service, str]
) -> None:
    worker, beat, name = celery_processes

    # The whole log: tasks a broker still held from before (a previous run's) are logged after
    # "ready." and would push it out of the tail.
    wait_until(lambda: "ready." in worker.log_text(), what="celery worker", process=worker)
    wait_until(lambda: "beat: Starting" in beat.log_text(), what="celery beat", process=beat)
    ping = subprocess.run(
        [*celery_command(), "inspect", "ping", "--destination", name, "--timeout", "10"],
        env=site_app.site.production.env_of("celery worker"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert "pong" in ping.stdout


def test_while_gunicorn_is_down_the_api_answers_in_json(
    site_app: App, site_proxy: Proxy, site_directory: Path
) -> None:
    # A second nginx with the same site (site_proxy: only where nginx is), in front of a port
    # where nothing listens.
    directory = site_directory / "nginx-without-upstream"
    directory.mkdir()
    proxy = nginx_start(
        directory=directory,
        upstream_port=free_port(),
        https_port=free_port(),
        static_root=site_app.site.production.static_root,
    )
    client = AgentClient(proxy.url, site_app.site.token)
    client.http.verify = str(proxy.certificate)
    client.http.trust_env = False
    try:
        response = client.post_call("get_order", {"order_id": "ORD-1"})
    finally:
        client.http.close()
        proxy.service.stop(signal.SIGTERM)

    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert response.json()["error"]["code"] == "service_unavailable"
