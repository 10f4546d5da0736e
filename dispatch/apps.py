from django.apps import AppConfig


class DispatchConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "dispatch"
    # Written once, never changed: `db_roles` grants the application's role no UPDATE or DELETE.
    # A policy changes by a new version; security events go only through the bounded prune
    # function (dispatch/store/guards.py).
    append_only_models = ("AuditRecord", "AuditSeal", "Policy", "SecurityEvent")
    # Never deleted (no DELETE); updated only as their lifecycle's or protocol's trigger allows.
    kept_models = ("Confirmation", "Movement")

    def ready(self) -> None:
        # Imported here: the tool reads models, which need the app registry ready.
        from dispatch.registry import tool_registry
        from dispatch.tools import dispatch_tools

        for spec in dispatch_tools():
            tool_registry.register(spec)
