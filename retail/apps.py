from django.apps import AppConfig

from dispatch.pipeline.review import ReviewView
from dispatch.pipeline.tools import ChangedWithOperation

OPERATION = "Operation.transaction_id"


class RetailConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "retail"
    verbose_name = "Retail desk"
    # Set once the tools are known (ready).
    execution_ledger: tuple[str, str, tuple[str, ...]] | None = None
    # Written once, never changed: `db_roles` grants the application's role no UPDATE or DELETE
    # (`load_retail`, which replaces the desk, runs as the tables' owner).
    append_only_models = ("Operation", "Payment")
    # What the desk's money checks read, changed only by a write that records its operation
    # (retail.gateway, or load_retail), guarded on PostgreSQL (dispatch/store/guards.py).
    money_guards = (
        ChangedWithOperation("PaymentMethod", ("balance_cents",), operation=OPERATION),
        ChangedWithOperation("Payment", (), operation=OPERATION),
        ChangedWithOperation("OrderItem", ("item_id", "price_cents"), operation=OPERATION),
    )

    def ready(self) -> None:
        # Imported here: the gateway imports models, which need the app registry ready.
        from dispatch.registry import tool_registry
        from retail.book import CURRENCY
        from retail.gateway import OrmRetailBook
        from retail.tools import retail_tools

        specs = retail_tools(OrmRetailBook())
        for spec in specs:
            tool_registry.register(spec)
        # Every write leaves its Operation under its key: an executed confirmation's, under its
        # execution key (the books' reconciler checks it, books/checks.py).
        self.execution_ledger = ("Operation", "idempotency_key", tuple(s.name for s in specs))
        tool_registry.register_currencies([CURRENCY])

    def customer_orders(self, customer_id: str) -> tuple[ReviewView, ...]:
        """The desk's orders of a customer, which the records' Orders page lists beside the
        refunds' orders without naming this app."""
        from retail.gateway import OrmRetailBook
        from retail.tools import customer_orders

        return customer_orders(OrmRetailBook(), customer_id)
