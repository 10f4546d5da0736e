"""An e-mail's signed link: it opens the card for its reviewer after login, as often as they
like until the call expires; it never decides; another reviewer, a forged or an expired link is
refused; and the decision made on the card is made once."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.notifying import mail_link
from dispatch.models import Confirmation, ConfirmationStatus, SecurityEvent
from orders.models import Refund
from tests.approvals.conftest import HeldRefund
from tests.approvals.notifications.conftest import SmtpServer, reviewer

pytestmark = pytest.mark.django_db(transaction=True)


def link_path(text: str) -> str:
    found = re.search(r"https://toolgate\.example\.test(/approvals/mail/[^\s]+/)", text)
    assert found is not None, text
    return found.group(1)


def events() -> list[tuple[str, str, int]]:
    return list(SecurityEvent.objects.order_by("id").values_list("channel", "reason", "status"))


def test_the_emailed_link_opens_the_card_after_login_again_and_again_and_decides_nothing(
    channels: None, smtp_server: SmtpServer, held_refund: HeldRefund
) -> None:
    ana = reviewer("ana")
    confirmation = held_refund(6_000)
    path = link_path(smtp_server.wait_for(1)[0].text())
    client = Client()

    anonymous = client.get(path)
    client.force_login(ana)
    first = client.get(path)
    second = client.get(path)

    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]
    assert first.status_code == second.status_code == 302
    assert first["Location"] == f"/approvals/{confirmation.pk}/"
    assert client.get(first["Location"]).status_code == 200
    confirmation.refresh_from_db()
    assert confirmation.status == ConfirmationStatus.PENDING
    assert Refund.objects.count() == 0


def test_another_reviewer_opening_the_link_is_refused_and_recorded(
    channels: None, smtp_server: SmtpServer, held_refund: HeldRefund
) -> None:
    reviewer("ana")
    bruno = reviewer("bruno")
    held_refund(6_000)
    mails = smtp_server.wait_for(2)
    anas = next(mail for mail in mails if mail.recipients == ["ana@example.test"])
    client = Client()
    client.force_login(bruno)

    answer = client.get(link_path(anas.text()))

    assert answer.status_code == 403
    assert "sent to another reviewer" in answer.content.decode()
    assert events() == [("mail", "mail_link_other_reviewer", 403)]


def test_a_forged_link_is_refused_and_recorded(channels: None, held_refund: HeldRefund) -> None:
    ana = reviewer("ana")
    confirmation = held_refund(6_000)
    genuine = mail_link(
        confirmation_id=confirmation.pk, user=ana, expires_at=confirmation.expires_at
    )
    token = genuine.rsplit("/mail/", 1)[1].rstrip("/")
    forged = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
    client = Client()
    client.force_login(ana)

    answer = client.get(f"/approvals/mail/{forged}/")

    assert answer.status_code == 400
    assert events() == [("mail", "mail_link_forged", 400)]


def test_a_link_of_a_call_that_expired_opens_nothing(
    channels: None, held_refund: HeldRefund
) -> None:
    ana = reviewer("ana")
    confirmation = held_refund(6_000)
    link = mail_link(
        confirmation_id=confirmation.pk,
        user=ana,
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    client = Client()
    client.force_login(ana)

    answer = client.get(link.removeprefix("https://toolgate.example.test"))

    assert answer.status_code == 410
    assert "has expired" in answer.content.decode()


def test_the_decision_from_the_card_the_link_opened_is_made_once(
    channels: None, smtp_server: SmtpServer, held_refund: HeldRefund
) -> None:
    ana = reviewer("ana")
    confirmation = held_refund(6_000)
    client = Client()
    client.force_login(ana)
    card = client.get(link_path(smtp_server.wait_for(1)[0].text()))["Location"]

    first = client.post(f"/approvals/{confirmation.pk}/approve", {"next": card}, follow=True)
    again = client.post(f"/approvals/{confirmation.pk}/approve", {"next": card}, follow=True)

    assert "Executed" in first.content.decode()
    assert "It is already" in again.content.decode()
    assert Refund.objects.count() == 1
    assert Confirmation.objects.get(pk=confirmation.pk).status == ConfirmationStatus.EXECUTED
