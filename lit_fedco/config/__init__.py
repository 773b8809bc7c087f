"""Configuration: the command line and presets (torch-free), the catalog behind --help, the typed
config."""
