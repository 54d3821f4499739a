"""The job's id and its file: with --checkpoint-dir the scheduler keeps the job id in
DIR/job.json (and, once the ranks are dealt, which device had which worker rank), so
that `--resume 1` continues the same job (the ESync state server's rows) and each
device goes on with its own data."""
from __future__ import annotations

import json
import logging
import os
import secrets
import time
from typing import Dict, Mapping, Optional

from esync.errors import UserError
from esync.logs.live import JOB_ID, JOB_ID_ENV, JOB_ID_FORM

JOB_FILE = "job.json"

log = logging.getLogger(__name__)


class JobFile:
    def __init__(self, folder: Optional[str], resume: bool, num_servers: int,
                 num_workers: int):
        self.folder, self.resume = folder, resume
        self.num_servers, self.num_workers = num_servers, num_workers
        #: names the job where several share a service (the ESync state server)
        self.job = time.strftime("job-%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        #: --resume: the worker rank each device (label@host) had
        self.previous_ranks: Dict[str, int] = {}

    @property
    def path(self) -> str:
        return os.path.join(self.folder, JOB_FILE)

    def name(self, environ: Mapping[str, str] = os.environ) -> None:
        """The job's id from ESYNC_JOB_ID where a launcher gave one (its live page is
        named so too); else the one drawn. A job resumed takes its saved id instead."""
        given = environ.get(JOB_ID_ENV, "")
        if not given:
            return
        if not JOB_ID.fullmatch(given):
            raise UserError(f"{JOB_ID_ENV}={given[:80]!r}: expected {JOB_ID_FORM}")
        self.job = given

    def open(self) -> None:
        """With --checkpoint-dir: keep the job id there; with --resume, take it back
        (UserError where it cannot)."""
        if not self.folder:
            if self.resume:
                raise UserError("--resume needs --checkpoint-dir (where the job's "
                                "checkpoints are)")
            return
        if self.resume:
            self._take_back()
            return
        try:
            os.makedirs(self.folder, exist_ok=True)
            self._write({"job": self.job, "num_servers": self.num_servers,
                         "num_workers": self.num_workers})
        except OSError as e:
            raise UserError(f"--checkpoint-dir {self.folder}: cannot write {JOB_FILE}: "
                            f"{e.strerror}") from None

    def _take_back(self) -> None:
        path = self.path
        try:
            with open(path) as f:
                saved = json.load(f)
            job = saved.get("job")
            ranks = saved.get("ranks")
        except (OSError, ValueError, AttributeError) as e:
            raise UserError(f"--resume: cannot read the job id from {path}: "
                            f"{getattr(e, 'strerror', None) or e}") from None
        if not isinstance(job, str) or not job:
            raise UserError(f"--resume: {path} names no job")
        self.job = job
        self.previous_ranks = ranks if isinstance(ranks, dict) else {}
        log.info("[scheduler] resuming job %s from %s", job, self.folder)

    def keep_ranks(self, ranks: Dict[str, Optional[int]]) -> None:
        """With --checkpoint-dir: which device (label@host) had which worker rank."""
        if not self.folder:
            return
        try:
            with open(self.path) as f:
                job = json.load(f)
            self._write({**job, "ranks": ranks})
        except (OSError, ValueError) as e:
            log.warning("[scheduler] cannot keep the workers' ranks in %s: %s", self.path, e)

    def _write(self, content: Dict) -> None:
        """Replace the file at once (a reader never sees half of it)."""
        with open(self.path + ".partial", "w") as f:
            json.dump(content, f)
        os.replace(self.path + ".partial", self.path)
