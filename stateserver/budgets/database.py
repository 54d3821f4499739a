"""The state server's database: one writer at a time in this process (`writing`), the
hot paths' reads as SQL written here (`select`, `count`), and at start-up that it can be
written, or, where it cannot, one line naming the setting and the file (instead of
Django's traceback)."""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator, List, Optional, Type

from django.conf import settings
from django.db import DatabaseError, connection, models, transaction

#: one writing transaction at a time in this process (runserver answers each connection
#: in a thread of its own)
_WRITER = threading.Lock()


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """A transaction that writes, one at a time in this process. SQLite lets one
    transaction write; the others, on their first write, sleep in its busy handler
    and try again (1, 2, 5 ... 100 ms): 16 workers asking for their budgets at once
    got the last answer after 90-150 ms, against 4 ms for one request alone, and the
    whole round waited for it. Queued here instead, they take their turns at once.
    (Several server processes on one database still meet at the database's lock.)"""
    with _WRITER, transaction.atomic():
        yield


def _where(model: Type[models.Model], equal: dict) -> tuple:
    quote = connection.ops.quote_name
    columns = [quote(model._meta.get_field(name).column) for name in equal]
    return " AND ".join(f"{c} = %s" for c in columns) or "1 = 1", list(equal.values())


def select(model: Type[models.Model], order_by: Optional[str] = None, lock: bool = False,
           **equal) -> List[models.Model]:
    """The rows of `model` whose fields are `equal` to the values given, as instances,
    in `order_by`'s order, locked for a write where the database locks rows (`lock`).
    The reads of what every worker asks every round (a budget, a live report) are these
    single SQL queries, not the ORM's: building the ORM's queries cost three quarters of
    a budget's 2.2 ms at 16 devices (docs/evidence/performance.md)."""
    quote = connection.ops.quote_name
    where, params = _where(model, equal)
    sql = f"SELECT * FROM {quote(model._meta.db_table)} WHERE {where}"
    if order_by is not None:
        sql += f" ORDER BY {quote(model._meta.get_field(order_by).column)}"
    if lock and connection.features.has_select_for_update:
        sql += " " + connection.ops.for_update_sql()
    return list(model.objects.raw(sql, params))


def count(model: Type[models.Model], **equal) -> int:
    """How many rows of `model` have fields `equal` to the values given (as `select`)."""
    where, params = _where(model, equal)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM "
                       f"{connection.ops.quote_name(model._meta.db_table)} WHERE {where}",
                       params)
        return cursor.fetchone()[0]


def check_writable() -> None:
    """A write that changes nothing, in a transaction: a database that can be read but
    not written (a read-only file or disk) fails here, at start-up, not later with a 500
    on every write. DatabaseError if it cannot."""
    from budgets.models import Job

    with transaction.atomic():
        Job.objects.filter(name="").update(round=0)  # job ids are 1 to 64 characters


def _sqlite_problem(path: str) -> str:
    """What is wrong with `path` as an SQLite file, as far as the file system says."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "it is a folder, not a file"
    if not os.path.exists(folder):
        return f"its folder {folder} does not exist"
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    return ""


def describe(error: DatabaseError) -> str:
    """One line: the setting, the database and what went wrong."""
    config = settings.DATABASES["default"]
    reason = " ".join(str(error).split()) or type(error).__name__
    if os.environ.get("ESYNC_DATABASE"):
        return (f"ESYNC_DATABASE: cannot use database {config.get('NAME')!r} "
                f"({config.get('ENGINE')}): {reason}")
    path = str(config.get("NAME"))
    problem = _sqlite_problem(path)
    if problem:
        return f"ESYNC_STATE_DB={path}: cannot use this database file: {problem}"
    return (f"ESYNC_STATE_DB={path}: cannot use this database file: {reason} (it must be "
            f"an SQLite file this process can read and write, or not exist yet in a folder "
            f"it can write)")
