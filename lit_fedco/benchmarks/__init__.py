"""Benchmarks (scripts, not tests): ``python -m lit_fedco.benchmarks.<name>``."""
