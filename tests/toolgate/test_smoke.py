import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_home_page_answers(client: Client) -> None:
    response = client.get("/")

    assert response.status_code == 200
    assert b"Toolgate" in response.content


def test_openapi_schema_is_public(client: Client) -> None:
    response = client.get("/api/schema/")

    assert response.status_code == 200
    assert b"Toolgate API" in response.content


def test_api_docs_are_served_without_a_cdn(client: Client) -> None:
    response = client.get("/api/docs/")

    assert response.status_code == 200
    assert b"cdn.jsdelivr.net" not in response.content


def test_admin_login_page_answers(client: Client) -> None:
    response = client.get("/admin/login/")

    assert response.status_code == 200


def test_login_page_answers(client: Client) -> None:
    response = client.get("/accounts/login/")

    assert response.status_code == 200
