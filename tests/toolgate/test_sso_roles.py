"""The roles a provider's groups give (toolgate/accounts.py): mapped by TOOLGATE_OIDC_ROLES, set
at every login, taken away when the group is."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from toolgate.accounts import roles_from_claims, user_roles_set

MAPPING = {"reviewers": "tg-review", "managers": "tg-ops", "administrators": "tg-admin"}


def test_each_mapped_group_gives_its_role_and_nothing_else_does() -> None:
    assert roles_from_claims({"groups": ["tg-review", "sales"]}, MAPPING, "groups") == {"reviewers"}
    assert roles_from_claims({"groups": "tg-admin"}, MAPPING, "groups") == {"administrators"}
    assert roles_from_claims({"roles": ["tg-ops"]}, MAPPING, "roles") == {"managers"}
    assert roles_from_claims({}, MAPPING, "groups") == set()
    # A role name the product does not know gives nothing, whatever the mapping says.
    assert roles_from_claims({"groups": ["x"]}, {"owners": "x"}, "groups") == set()


@pytest.mark.django_db
def test_a_group_removed_at_the_provider_is_a_role_removed_here() -> None:
    user = User.objects.create_user("rita")
    user_roles_set(user, {"reviewers", "administrators"})
    assert list(user.groups.values_list("name", flat=True)) == ["reviewers"]
    assert user.is_staff and user.is_superuser

    user_roles_set(user, {"managers"})

    user.refresh_from_db()
    assert list(user.groups.values_list("name", flat=True)) == ["managers"]
    assert not (user.is_staff or user.is_superuser)
