from django.apps import AppConfig


class DispatchConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "dispatch"
    # Written once, never changed: `db_roles` grants the application's role no UPDATE or DELETE.
    append_only_models = ("AuditRecord",)
