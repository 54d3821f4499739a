"""esync: data-parallel training on heterogeneous clusters (ESync, SSGD, ASGD, DC-ASGD)."""

__version__ = "0.1.0"
