"""`runserver` that first applies the migrations, so that the original's command
(`python manage.py runserver 0.0.0.0:10010`) works on a fresh clone with no other step.
Production servers (gunicorn) need `python manage.py migrate` once beforehand."""
import os

from django.core.management import call_command
from django.core.management.commands.runserver import Command as RunServer


class Command(RunServer):
    help = "Apply pending migrations, then start the development server."

    def handle(self, *args, **options):
        if os.environ.get("RUN_MAIN") != "true":  # not again in the autoreloader's child
            call_command("migrate", interactive=False, verbosity=0)
        super().handle(*args, **options)
