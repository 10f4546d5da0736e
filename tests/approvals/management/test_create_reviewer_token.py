from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.core.management.base import CommandError

from approvals.models import ReviewerToken
from approvals.reviewers import REVIEWERS_GROUP, reviewer_authenticate
from dispatch.services import token_hash
from tests.conftest import Run, printed_token

pytestmark = pytest.mark.django_db


def test_it_prints_a_token_once_that_authenticates_its_user_and_stores_only_its_hash(
    run: Run,
) -> None:
    user = User.objects.create_user("rita")
    user.groups.add(Group.objects.create(name=REVIEWERS_GROUP))

    output = run("create_reviewer_token", "rita")

    token = printed_token(output)
    assert reviewer_authenticate(token) == user
    assert ReviewerToken.objects.get(user=user).token_hash == token_hash(token) != token
    assert "will not be shown again" in output
    assert "not in the 'reviewers' group" not in output


def test_a_new_token_replaces_the_old_one(run: Run) -> None:
    User.objects.create_user("rita")
    old = printed_token(run("create_reviewer_token", "rita"))

    new = printed_token(run("create_reviewer_token", "rita"))

    assert reviewer_authenticate(old) is None
    assert reviewer_authenticate(new) is not None
    assert ReviewerToken.objects.count() == 1


def test_it_says_when_the_user_cannot_review_yet(run: Run) -> None:
    User.objects.create_user("max")

    output = run("create_reviewer_token", "max")

    assert "not in the 'reviewers' group" in output


def test_it_refuses_an_unknown_or_inactive_user(run: Run) -> None:
    User.objects.create_user("gone", is_active=False)

    with pytest.raises(CommandError, match="No user named 'nobody'"):
        run("create_reviewer_token", "nobody")
    with pytest.raises(CommandError, match="inactive"):
        run("create_reviewer_token", "gone")

    assert not ReviewerToken.objects.exists()
