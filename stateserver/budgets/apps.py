from django.apps import AppConfig


class BudgetsConfig(AppConfig):
    name = "budgets"
    verbose_name = "ESync local-iteration budgets"
    default_auto_field = "django.db.models.BigAutoField"
