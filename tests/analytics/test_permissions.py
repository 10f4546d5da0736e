"""One rule for who is a manager, the same on the pages, the API and the navigation: the
`managers` group, and nothing else, superusers included."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from analytics.permissions import MANAGERS_GROUP, is_manager

MANAGERS_PLACES = ("/analytics/", "/api/v1/metrics")


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_a_superuser_outside_the_group_is_refused_on_the_pages_and_the_api_alike() -> None:
    admin = User.objects.create_superuser("ada", password="pw")
    client = signed_in(admin)

    answers = [client.get(path).status_code for path in MANAGERS_PLACES]

    assert answers == [403, 403]
    assert "/analytics/" not in client.get("/").content.decode()


@pytest.mark.django_db
def test_a_superuser_in_the_group_reads_both() -> None:
    admin = User.objects.create_superuser("ada", password="pw")
    admin.groups.add(Group.objects.create(name=MANAGERS_GROUP))
    client = signed_in(admin)

    answers = [client.get(path).status_code for path in MANAGERS_PLACES]

    assert answers == [200, 200]


@pytest.mark.django_db
def test_an_inactive_member_is_no_manager() -> None:
    member = User.objects.create_user("max", password="pw", is_active=False)
    member.groups.add(Group.objects.create(name=MANAGERS_GROUP))

    assert not is_manager(member)
