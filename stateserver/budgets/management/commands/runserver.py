"""`runserver` that first applies the migrations, so that the original's command
(`python manage.py runserver 0.0.0.0:10010`) works on a fresh clone with no other step,
and that answers kept-alive connections without Nagle's delay. Production servers
(gunicorn, which sets TCP_NODELAY itself) need `python manage.py migrate` once.

Given port 0 (`runserver 127.0.0.1:0`) it listens on a free port the OS picks, and
reports it to a supervisor that asked for it (esync.ready: ESYNC_READY_FD)."""
import os
import socket

from esync import ready

from django.core.management import call_command
from django.core.management.commands.runserver import Command as RunServer
from django.core.servers.basehttp import WSGIServer


class NoDelayWSGIServer(WSGIServer):
    """Django's development server, with TCP_NODELAY on each connection: it writes an
    answer's headers and body separately, and on a kept-alive connection Nagle's
    algorithm would hold the body back until the client's delayed ACK (40 ms)."""

    def get_request(self):
        conn, address = super().get_request()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, address


class Command(RunServer):
    help = "Apply pending migrations, then start the development server."
    server_cls = NoDelayWSGIServer

    def on_bind(self, server_port):
        super().on_bind(server_port)
        self.stdout.flush()
        ready.announce(server_port)

    def handle(self, *args, **options):
        if os.environ.get("RUN_MAIN") != "true":  # not again in the autoreloader's child
            call_command("migrate", interactive=False, verbosity=0)
        super().handle(*args, **options)
