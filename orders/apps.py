from django.apps import AppConfig

from dispatch.pipeline.tools import FixedOnceInLedger, SumOfLedger


class OrdersConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "orders"
    # Written once, never changed: `db_roles` grants the application's role no UPDATE or DELETE.
    append_only_models = ("Refund",)
    # Where an executed refund writes its one row, under its execution key: (model, key field,
    # tools), which the books' reconciler checks (books/checks.py). Every version of the refund.
    execution_ledger = ("Refund", "idempotency_key", ("refund_order", "refund_order_v2"))
    # What a refund's checks read, guarded on PostgreSQL (dispatch/store/guards.py): refunded_cents
    # moves only with its ledger row; what the ledger's rows were judged against is fixed once
    # there is one (the admin edits an order only before its first refund).
    money_guards = (
        SumOfLedger("Order", "refunded_cents", ledger="Refund.order", amount="amount_cents"),
        FixedOnceInLedger(
            "Order", ("order_id", "customer_id", "total_cents", "currency"), ledger="Refund.order"
        ),
    )

    def ready(self) -> None:
        # Imported here: the gateway imports models, which need the app registry ready.
        from dispatch.registry import tool_registry
        from orders.book import ORDER_SOURCE
        from orders.gateway import ORDER_LOOKUP_SOURCE, OrmOrderBook
        from orders.tools import CURRENCIES, order_tools

        for spec in order_tools(OrmOrderBook()):
            tool_registry.register(spec)
        tool_registry.register_currencies(CURRENCIES)
        tool_registry.register_lookup_source(ORDER_SOURCE, ORDER_LOOKUP_SOURCE)
