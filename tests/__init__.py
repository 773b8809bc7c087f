"""The test suite, laid out like the package: ``tests/<subpackage>/`` holds the tests of
``lit_fedco/<subpackage>/``; tests of the top-level modules and project-wide checks (docs,
changelog, packaging, import layers, conventions) and the shared helpers stay here. Every
folder is a package, so test modules are imported by their full names (``tests.core.test_...``)."""
