"""The reviewer pages' fixtures, shared: users by role and refunds held by the real pipeline."""

from tests.approvals.conftest import (  # noqa: F401
    hold_refund,
    holding_agent,
    make_user,
    manager,
    reviewer,
)
