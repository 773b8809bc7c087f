"""The presets shipped with lit_fedco: YAML files, one experiment setting each.

This folder is installed as the package ``lit_fedco.presets`` (pyproject.toml), so that
``preset=NAME`` finds them in an installed package as in a checkout
(:func:`lit_fedco.config.parser.preset_dir`).
"""
