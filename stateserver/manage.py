#!/usr/bin/env python
"""The ESync state server's Django command line (`python manage.py runserver 0.0.0.0:10010`).

A bad setting (an ESYNC_* variable out of range, see stateserver/settings.py) or a
database that cannot be opened or written ends it with one line naming the variable or
the file, and exit status 2, instead of Django's traceback."""
import os
import sys


def _fail(message: str) -> None:
    prog = os.path.basename(sys.argv[0]) or "manage.py"
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateserver.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line
    from django.db import DatabaseError

    try:
        settings.INSTALLED_APPS  # reads and checks the ESYNC_* variables, now
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as e:
        _fail(" ".join(str(e).split()))
    except DatabaseError as e:
        from budgets.database import describe

        _fail(describe(e))


if __name__ == "__main__":
    main()
