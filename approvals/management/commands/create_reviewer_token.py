"""Make a person's API token and print it, once; it replaces the token they had."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals.reviewers import REVIEWERS_GROUP, is_reviewer, reviewer_token_create


class Command(BaseCommand):
    help = (
        "Make a personal API token for a user (replacing their previous one) and print it once. "
        "Toolgate keeps only its hash; the user's groups decide what it opens."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="the user's login name")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        if not user.is_active:
            raise CommandError(f"The user {username!r} is inactive; a token would not work.")
        token = reviewer_token_create(user=user)
        self.stdout.write(self.style.SUCCESS(f"Made a new token for {username!r}."))
        self.stdout.write("")
        self.stdout.write(f"Token: {token}")
        self.stdout.write(
            self.style.WARNING(
                "This token is shown once and will not be shown again: store it now. "
                "Toolgate keeps only its hash. Any earlier token of this user no longer works."
            )
        )
        if not is_reviewer(user):
            self.stdout.write(
                self.style.WARNING(
                    f"{username!r} is not in the {REVIEWERS_GROUP!r} group: the token cannot "
                    "decide confirmations until they are."
                )
            )
