"""The CPU allocator setting (lit_fedco/process/cpu_memory.py): applied on Linux with glibc, left
alone when opted out; each case in a fresh process, since the setting is per process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO

CODE = (
    "from lit_fedco.process.cpu_memory import keep_freed_memory as k; import sys; "
    "a = k(); b = k(); print(a, b)"
)


def run(env_value: str | None) -> str:
    import os

    env = {key: v for key, v in os.environ.items() if key != "LIT_FEDCO_SYSTEM_MALLOC"}
    if env_value is not None:
        env["LIT_FEDCO_SYSTEM_MALLOC"] = env_value
    proc = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    return proc.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_applied_once_on_linux_glibc():
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    assert run(None) == "True True"
    assert run("0") == "True True"


def test_opt_out_leaves_malloc_alone():
    assert run("1") == "False False"
