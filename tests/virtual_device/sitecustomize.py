"""Run a whole Python process under the virtual device (tests/virtual_device.py).

    PYTHONPATH=tests/virtual_device:$PYTHONPATH ESYNC_VIRTUAL_DEVICE=1 python train.py

Python imports `sitecustomize` at start-up from the path; this folder holds only this
file, so that putting it first on PYTHONPATH adds nothing else. Without
ESYNC_VIRTUAL_DEVICE=1 it does nothing. With it, it does not import torch (a second
in every Python process, many of which never use it: launchers, log tools): it puts a
finder first on `sys.meta_path` that, when the process first imports `torch`, lets the
import run to its end and then enters `VirtualDevice` once for the rest of the process
(never exited), in the thread that imported torch (the main thread of a training
script). Processes started by this one (esync-run's workers, DataLoader workers
started by spawn) inherit the environment and do the same; DataLoader workers started
by fork inherit the mode itself (their tensors come back to the parent on the host, as
from a real GPU's workers).

A sitecustomize further along the path (the environment's own, if any) still runs.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _activate() -> None:
    """Enter the virtual device for the rest of the process (torch is imported)."""
    import importlib.util

    path = os.path.join(os.path.dirname(_HERE), "virtual_device.py")
    spec = importlib.util.spec_from_file_location("esync_virtual_device", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    mode = module.VirtualDevice()
    mode.__enter__()  # process-wide: never exited
    module.ACTIVE = mode


class _WhenTorchIsImported:
    """A meta-path finder that only watches for `torch`: it finds it as the other
    finders would, and has its loader enter the mode once torch has been executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util

        sys.meta_path.remove(self)  # once: the real finders find torch
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _activate()

        spec.loader.exec_module = exec_module
        return spec


def _chain() -> None:
    """Run the sitecustomize this one hides (the next one on sys.path), if any."""
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get("ESYNC_VIRTUAL_DEVICE") == "1":
    if "torch" in sys.modules:  # imported already (not at start-up): enter now
        _activate()
    else:
        sys.meta_path.insert(0, _WhenTorchIsImported())
_chain()
