from django.apps import AppConfig


class RetailConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "retail"
    verbose_name = "Retail desk"

    def ready(self) -> None:
        # Imported here: the gateway imports models, which need the app registry ready.
        from dispatch.registry import tool_registry
        from retail.book import CURRENCY
        from retail.gateway import OrmRetailBook
        from retail.tools import retail_tools

        for spec in retail_tools(OrmRetailBook()):
            tool_registry.register(spec)
        tool_registry.register_currencies([CURRENCY])
