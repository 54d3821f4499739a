"""Settings of the ESync state server, from environment variables with safe defaults.

- ESYNC_STATE_DB: path of the SQLite database (default: db.sqlite3 next to manage.py).
- ESYNC_DATABASE: a JSON object used as Django's DATABASES["default"] instead, for any
  database Django supports, e.g. {"ENGINE": "django.db.backends.postgresql", "NAME": ...}.
- ESYNC_DEBUG: 1 turns Django's DEBUG on (off by default).
- ESYNC_ALLOWED_HOSTS: comma-separated host names the server answers to (default "*":
  workers reach it by whatever address the cluster has, and the API serves no pages,
  cookies or links that a forged Host header could poison).
- ESYNC_SECRET_KEY: Django's secret key. Nothing here signs data (no sessions, no
  logins, no CSRF tokens), so by default each process draws a random one.
- ESYNC_SMOOTHING: weight of the newest measurement in the moving average of a
  device's time per local iteration, in (0, 1] (default 0.3).
- ESYNC_STATE_TOKEN: when set (printable ASCII, no spaces: it travels in an HTTP
  header), every write (any method but GET and HEAD) must carry
  `Authorization: Bearer <token>`, compared in constant time (budgets.guard): no or a
  garbled header is answered 401, another token 403, and nothing changes. Reads stay
  open: they show jobs' rounds, timings and budgets, nothing a worker could be fooled
  with. Unset (or empty), writes are unauthenticated, as on a trusted network, and the
  server says so once at start-up. Workers send the token from the same variable.

A bad value is an ImproperlyConfigured naming the variable and what it must be;
manage.py prints it as one line and exits with status 2 (as it does for a database that
cannot be opened or written: budgets/database.py).

Limits on what one request may cost (budgets.guard, budgets.views): a request body of
at most MAX_BODY_BYTES (a larger declared Content-Length is answered 413 without
reading it); the rest are constants in budgets/views.py (workers per job, jobs and
devices per page of /status/) and in the runserver command (connection timeouts).
"""
import json
import os
import re
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _database() -> dict:
    raw = os.environ.get("ESYNC_DATABASE")
    if raw:
        try:
            config = json.loads(raw)
        except ValueError as e:
            raise ImproperlyConfigured(f"ESYNC_DATABASE is not JSON: {e}") from None
        if not isinstance(config, dict) or "ENGINE" not in config:
            raise ImproperlyConfigured("ESYNC_DATABASE must be a JSON object with an ENGINE")
        return config
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("ESYNC_STATE_DB") or str(BASE_DIR / "db.sqlite3"),
        "CONN_MAX_AGE": 600,  # a worker's kept-alive connection keeps its database session
        "OPTIONS": {
            # take the write lock when a transaction starts, so that concurrent reports
            # from several server processes queue up instead of failing with "locked"
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }


def _smoothing() -> float:
    raw = os.environ.get("ESYNC_SMOOTHING", "0.3")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise ImproperlyConfigured(f"ESYNC_SMOOTHING must be a number in (0, 1], got {raw!r}")
    return value


def _token():
    """ESYNC_STATE_TOKEN, or None where it is unset or empty."""
    raw = os.environ.get("ESYNC_STATE_TOKEN", "")
    if not raw:
        return None
    if not re.fullmatch(r"[!-~]+", raw):
        raise ImproperlyConfigured("ESYNC_STATE_TOKEN must be printable ASCII without spaces "
                                   "(it travels in an HTTP header)")
    return raw


DEBUG = _flag("ESYNC_DEBUG")
SECRET_KEY = os.environ.get("ESYNC_SECRET_KEY") or secrets.token_urlsafe(50)
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ESYNC_ALLOWED_HOSTS", "*").split(",")
                 if h.strip()]

INSTALLED_APPS = ["budgets"]
MIDDLEWARE = [
    # first: refuses oversized, unframed and unauthenticated requests before anything
    # reads them, and reads an accepted POST's body itself (budgets/guard.py)
    "budgets.guard.Guard",
    "django.middleware.security.SecurityMiddleware",
    # sets Content-Length, without which runserver closes each connection after one answer
    "django.middleware.common.CommonMiddleware",
]
ROOT_URLCONF = "stateserver.urls"
# the live page's templates (budgets/templates/); nothing else of Django's is rendered
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
              "OPTIONS": {"context_processors": []}}]
WSGI_APPLICATION = "stateserver.wsgi.application"
APPEND_SLASH = False  # a POST redirected to the slashed URL would lose its body

DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"

BUDGET_SMOOTHING = _smoothing()

#: the token every write must carry (None: writes are open)
STATE_TOKEN = _token()
#: the largest request body accepted: the API's bodies are a few dozen bytes
MAX_BODY_BYTES = 64 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_BODY_BYTES  # Django's own check, for the same bound

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"budgets": {"handlers": ["console"], "level": "INFO"}},
}
