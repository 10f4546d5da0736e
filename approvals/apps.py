from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "approvals"
    # The application's database role may only INSERT and SELECT these (manage.py db_roles).
    append_only_models = ("ConfirmationEvent",)
