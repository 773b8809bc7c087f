"""Errors raised on bad user input."""

from __future__ import annotations

import sys
from typing import Any, NoReturn


class ConfigError(ValueError):
    """Bad user input: the message names the key, the value, what was expected and how to fix it.

    Build field errors with :meth:`bad_value` so that a caller that knows where the field sits in
    the config (``client_dro.gamma`` rather than ``gamma``) can re-key them with :meth:`under`.
    """

    def __init__(self, message: str, *, key: str | None = None, parts: tuple[Any, ...] = ()):
        super().__init__(message)
        self.key = key
        self.parts = parts

    @classmethod
    def bad_value(cls, key: str, value: Any, expected: str, example: str) -> ConfigError:
        """``key: got VALUE, expected EXPECTED; set e.g. key=EXAMPLE``."""
        msg = f"{key}: got {value!r}, expected {expected}; set e.g. {key}={example}"
        return cls(msg, key=key, parts=(value, expected, example))

    def under(self, prefix: str) -> ConfigError:
        """The same error with its key placed under ``prefix`` (no-op for free-form errors)."""
        if self.key is None or not self.parts:
            return self
        return ConfigError.bad_value(f"{prefix}.{self.key}", *self.parts)

    def within(self, where: str) -> ConfigError:
        """The same error, saying where the bad value came from (e.g. which variant)."""
        out = ConfigError(f"{self} (in {where})", key=self.key)
        out.parts = self.parts
        return out


def refuse(err: ConfigError) -> NoReturn:
    """End the process with exit code 2 and ``err`` in one line (``lit_fedco: <err>``), as
    every refusal of bad input does."""
    print(f"lit_fedco: {err}", file=sys.stderr)
    raise SystemExit(2) from None
