"""Reporting: experiment tracking (W&B, CSV), figures, reading W&B offline runs back."""
