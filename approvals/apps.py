from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "approvals"
    # The application's database role may only INSERT and SELECT these (manage.py db_roles).
    # A vote, once cast, stays; so does every event of a confirmation's log.
    append_only_models = ("ConfirmationEvent", "PolicyEvent", "Vote")
    # ... and may not delete these: a policy change, drafted, stays on record.
    kept_models = ("PolicyChange",)

    def ready(self) -> None:
        # The event log is chained: sealed and verified with the audit records.
        from approvals.chains import confirmation_events, policy_events
        from dispatch.audit import chain_source_register

        chain_source_register(confirmation_events)
        chain_source_register(policy_events)

        # The agent's doors withdraw a held call through dispatch, which names no approvals.
        from approvals.deciding import confirmation_withdraw
        from dispatch.withdrawal import withdrawal_register

        withdrawal_register(confirmation_withdraw)
        # A new hold is announced, and a decision updates its Slack messages: approvals listens
        # to the confirmation's own saves, since dispatch may not import it (notifications.py).
        from django.db.models.signals import post_save

        from approvals.notifications import notifications_on_hold
        from dispatch.models import Confirmation

        post_save.connect(
            notifications_on_hold, sender=Confirmation, dispatch_uid="approvals.notifications"
        )
