from collections.abc import Iterable

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from dispatch.pipeline.tools import ToolRegistry


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
        # The apps that declare tools come before this one (INSTALLED_APPS): every tool is known.
        tools_retire_and_check(settings.TOOLGATE_RETIRED_TOOLS, tool_registry)


def tools_retire_and_check(retired: Iterable[str], registry: ToolRegistry) -> None:
    """Retire the tools a setting names, and refuse to start on versions that do not hold
    together (a `replaces` naming no tool, two successors of one, a cycle)."""
    try:
        for name in retired:
            registry.set_retired(name)
        registry.check_versions()
    except ValueError as exc:
        raise ImproperlyConfigured(f"tool versions: {exc}") from None
