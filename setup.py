"""Installs the `esync` package, the top-level `config` and `main` modules, and `esync`.

On machines where a plain `torch` requirement would pull a multi-GB CUDA build, install
the CPU build first (`pip install torch==2.13.0`); the range below accepts it.
"""
from setuptools import find_packages, setup

setup(
    name="esync",
    version="0.1.0",
    description="Data-parallel training on heterogeneous clusters: ESync, SSGD, ASGD, DC-ASGD",
    python_requires=">=3.10",
    packages=find_packages(include=["esync", "esync.*"]),
    py_modules=["config", "main"],
    install_requires=[
        "torch>=2.1",
        "numpy>=1.22",
        "pyzmq>=25",
        "msgpack>=1.0",
        "django>=5.1",
        "matplotlib>=3.6",
        "argparse-dataclass>=2.0",
        "scikit-learn>=1.1",
    ],
    extras_require={"dev": ["pytest>=7", "pytest-django>=4.5"]},
    entry_points={"console_scripts": ["esync = esync.cli:main"]},
)
