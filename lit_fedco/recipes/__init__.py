"""One module per experiment.

Run as ``python -m lit_fedco.recipes.<name> [preset=...] [key=value ...]``.
"""
