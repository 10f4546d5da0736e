from __future__ import annotations

import pytest

from orders.models import GatewayFault
from orders.services import gateway_fault_consume, gateway_faults_set

pytestmark = pytest.mark.django_db


def test_gateway_faults_set_keeps_a_single_row() -> None:
    gateway_faults_set(fail_before_commit=2)
    fault = gateway_faults_set(lose_response_after_commit=1)

    assert GatewayFault.objects.count() == 1
    fault.refresh_from_db()
    assert (fault.pk, fault.fail_before_commit, fault.lose_response_after_commit) == (1, 0, 1)


def test_a_fault_is_consumed_one_at_a_time_until_none_is_left() -> None:
    gateway_faults_set(fail_before_commit=2, lose_response_after_commit=1)

    consumed = [gateway_fault_consume(kind="fail_before_commit") for _ in range(3)]

    assert consumed == [True, True, False]
    fault = GatewayFault.objects.get()
    assert (fault.fail_before_commit, fault.lose_response_after_commit) == (0, 1)


def test_no_fault_is_consumed_before_the_switch_was_ever_set() -> None:
    assert gateway_fault_consume(kind="lose_response_after_commit") is False
    assert not GatewayFault.objects.exists()
