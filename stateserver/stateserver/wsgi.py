"""WSGI entry point, for a production server with several worker processes
(`gunicorn -w 4 -b 0.0.0.0:10010 stateserver.wsgi`): they share one state through the
database."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateserver.settings")
application = get_wsgi_application()
