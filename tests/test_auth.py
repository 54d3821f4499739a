"""A job with a job key (CurveZMQ): a model of several chunks moves through real
scheduler and server processes (the encrypted frames are a little bigger than a chunk,
and the servers still take them), and a bad key is one line naming the variable."""
import threading

import numpy as np
import pytest

from esync.errors import UserError
from esync.comm.kvstore import KVStore
from esync.transport.auth import KEY_ENV, KEY_FILE_ENV, job_key, new_key
from esync.transport.cluster import ClusterEnv
from esync.transport.message import CHUNK_VALUES
from esync.transport.node import Node
from tests.cluster import Cluster

VALUES = CHUNK_VALUES + CHUNK_VALUES // 2  # two chunks, the first a whole one


@pytest.mark.slow
def test_a_keyed_job_moves_whole_chunks(tmp_path, monkeypatch):
    key = new_key()
    monkeypatch.setenv(KEY_ENV, key)
    with Cluster(tmp_path, num_servers=1, num_workers=1, env={KEY_ENV: key}) as job:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        env = {k: v for k, v in job.env.items() if k.startswith(("DMLC_", "PS_"))}
        node = Node(ClusterEnv.from_environ({**env, "DMLC_ROLE": "worker"}), "worker")
        try:
            servers = node.register()["servers"]
            kv = KVStore(node, servers, 0, VALUES, 2)
            weights = np.linspace(-1, 1, VALUES).astype(np.float32)
            params, buffers = np.zeros_like(weights), np.zeros(2, np.float32)

            def train():
                kv.init({"name": "sync", "num_workers": 1, "lr": 0.5}, weights,
                        np.ones(2, np.float32))
                kv.push_pull(1, np.ones_like(weights), np.full(2, 3.0, np.float32), params,
                             buffers)

            # a server that cut the worker off would leave it waiting: fail, not hang
            worker = threading.Thread(target=train, daemon=True)
            worker.start()
            worker.join(30)
            assert not worker.is_alive(), "the keyed push of whole chunks got no answer"
            np.testing.assert_allclose(params, weights - 0.5)
            np.testing.assert_array_equal(buffers, [3.0, 3.0])
            kv.close()
            node.finish()
        finally:
            node.close()
        assert job.wait(30) == {"scheduler": 0, "server0": 0}
        assert "CurveZMQ: job key required" in job.output("scheduler")


def test_a_bad_key_is_one_line_naming_the_variable(tmp_path):
    with pytest.raises(UserError, match=f"^{KEY_ENV}: not a job key"):
        job_key({KEY_ENV: "too short"})
    missing = tmp_path / "nope.key"
    with pytest.raises(UserError, match=f"^{KEY_FILE_ENV}={missing}: cannot read it"):
        job_key({KEY_FILE_ENV: str(missing)})
    keyfile = tmp_path / "job.key"
    keyfile.write_text(new_key() + "\n")
    assert job_key({KEY_FILE_ENV: str(keyfile)}) is not None
    assert job_key({}, warn=False) is None
