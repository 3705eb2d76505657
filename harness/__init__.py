"""Benchmarking harness for implicit ensembles.

Data flows one way: suite YAML → validated suite → cells → executor → cell runner → result
records → reporter. See ``docs/architecture.md``.
"""

__version__ = "0.1.0"
