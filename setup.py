"""Installs one package, `esync` (from src/: the runtime, its launchers `esync.launch` and
its log tools `esync.logs_tools`), and nothing else at the top level, so that no module
of esync's can shadow, or be shadowed by, a user's files (a `config.py`, `main.py` or
`launch.py` beside a training script, or an esync checkout named `esync/`: with the src
layout an editable install is a plain path entry, and a regular package wins over such a
folder). The commands: `esync` (the same as `python main.py` in a checkout),
`esync-launch` (esync/launch/local.py; `--ray` needs the `ray` extra), `esync-run`
(esync/launch/run.py: a training script of your own as the workers), `esync-hosts`,
`esync-pack` (esync/data/pack.py: data sets as shards), `esync-experiment`,
`esync-stalls` (where each device's time goes, and what would help), `esync-summary`,
`esync-draw` and `esync-compare` (esync/logs_tools/).

On machines where a plain `torch` requirement would pull a multi-GB CUDA build, install
the CPU build first (`pip install torch==2.13.0`); the range below accepts it.
"""
from setuptools import find_packages, setup

setup(
    name="esync",
    version="0.1.0",
    description="Data-parallel training on heterogeneous clusters: ESync, SSGD, ASGD, DC-ASGD",
    python_requires=">=3.10",
    package_dir={"": "src"},
    packages=find_packages("src", include=["esync", "esync.*"]),
    install_requires=[
        "torch>=2.1",
        "numpy>=1.22",
        "pyzmq>=25",
        "msgpack>=1.0",
        "django>=5.1",
        "matplotlib>=3.6",
        "argparse-dataclass>=2.0",
        "scikit-learn>=1.1",
        "tqdm>=4.60",
        "safetensors>=0.4",  # checkpoints: tensors that load without unpickling
        "torchdata>=0.9",  # StatefulDataLoader: prepared loaders over shards resume exactly
        "pillow>=9",  # --dataset folder (esync.data.formats): torchvision's registry
        #               wheel is a CUDA build that does not import beside CPU torch
    ],
    # pytest-xdist: `python -m pytest -q -n 2` runs the tests on two processes
    # (3.6.1: --no-loadscope-reorder);
    # hypothesis: property-based tests of the wire format
    # ray: `esync-launch --ray` (launch/onray.py; and launch/rayprep.py, in a
    # worker only with --remote-prep), with Ray's
    # state API and `ray list actors` (the [default] extra)
    extras_require={"dev": ["pytest>=7", "pytest-django>=4.5", "pytest-xdist>=3.6.1",
                            "hypothesis>=6.80", "tensorboard>=2.14",
                            "webdataset>=0.2",  # shards read by WebDataset (interop test)
                            # the live job page's browser tests (Debian's chromium and
                            # chromedriver, which .ci/run installs)
                            "selenium>=4.20"],
                    "ray": ["ray[default]>=2.49"],
                    "tensorboard": ["tensorboard>=2.14"],
                    # the manual (docs/, mkdocs.yml): `mkdocs serve`
                    "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5",
                             "mkdocstrings[python]>=0.26", "mkdocs-gen-files>=0.5"]},
    entry_points={"console_scripts": [
        "esync = esync.cli:console_main",
        "esync-launch = esync.launch.local:console_main",
        "esync-run = esync.launch.run:console_main",
        "esync-hosts = esync.launch.hosts:console_main",
        "esync-experiment = esync.launch.experiment:console_main",
        "esync-summary = esync.logs_tools.summary:console_main",
        "esync-draw = esync.logs_tools.drawer:console_main",
        "esync-compare = esync.logs_tools.compare:console_main",
        "esync-pack = esync.data.pack:console_main",
        "esync-stalls = esync.launch.stalls:console_main",
    ]},
)
