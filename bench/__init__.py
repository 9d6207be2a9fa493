"""Benchmarks: ``make bench`` (``python -m bench``). Figures go to stdout."""
