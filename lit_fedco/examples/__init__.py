"""Small runnable examples: ``python -m lit_fedco.examples.<name>``."""
