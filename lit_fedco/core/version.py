"""The version of lit_fedco (its pyproject's ``version``), recorded in every checkpoint."""

VERSION = "0.4.0"
