"""esync: data-parallel training on heterogeneous clusters (ESync, SSGD, ASGD, DC-ASGD).

The public API (esync.runtime.api) for a training script of your own::

    import esync
    esync.init()
    model = esync.prepare_model(model)
    loader = esync.prepare_data_loader(loader)
    optimizer = esync.DistributedOptimizer(optimizer)
    # or with the algorithm's settings in code:
    # esync.DistributedOptimizer(optimizer, algorithm=esync.ESync(max_local_steps=16))

Its names are imported on first use, so that `import esync` stays cheap (no torch) for
the launchers and log tools.
"""

__version__ = "0.1.0"

from esync import registry as _registry

#: the algorithm objects (esync.algorithms: each algorithm's policy, torch-free), by
#: name: the registry's rows say where each one lives
_ALGORITHMS = dict(row.policy.split(":")[::-1] for row in _registry.ALGORITHMS.values())

#: the public API, in esync.runtime.api (ShardDataset, in esync.data.decode: shards written by esync-pack, whose
#: prepared loader reads them block by block)
__all__ = ["init", "prepare_model", "prepare_data_loader", "prepare_scheduler",
           "DistributedOptimizer", "report", "should_stop", "finish", "get_session",
           "get_device", "ShardDataset", *_ALGORITHMS]


def __getattr__(name: str):
    if name in _ALGORITHMS:
        import importlib

        return getattr(importlib.import_module(_ALGORITHMS[name]), name)
    if name == "ShardDataset":
        from esync.data.decode import ShardDataset

        return ShardDataset
    if name in __all__:
        from esync.runtime import api

        return getattr(api, name)
    raise AttributeError(f"module 'esync' has no attribute {name!r}")
