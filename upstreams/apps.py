from django.apps import AppConfig


class UpstreamsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "upstreams"
    verbose_name = "Upstreams"

    def ready(self) -> None:
        from django.conf import settings

        from dispatch.registry import tool_registry
        from upstreams.registry import upstreams_register

        upstreams_register(settings.TOOLGATE_UPSTREAMS, tool_registry)
