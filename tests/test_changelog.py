"""CHANGELOG.md is in Keep a Changelog form and names the release the package says it is."""

from __future__ import annotations

import re

import lit_fedco
from tests.helpers import REPO

SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def _releases(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", text, flags=re.M)


def test_the_version_is_the_latest_release():
    text = (REPO / "CHANGELOG.md").read_text()
    releases = _releases(text)
    assert releases, "CHANGELOG.md names no release"
    assert lit_fedco.__version__ == releases[0][0]
    versions = [tuple(int(p) for p in v.split(".")) for v, _ in releases]
    assert versions == sorted(versions, reverse=True)  # newest first
    dates = [d for _, d in releases]
    assert dates == sorted(dates, reverse=True)


def test_every_section_is_a_keep_a_changelog_kind_and_every_entry_one_line():
    text = (REPO / "CHANGELOG.md").read_text()
    body = text[text.index("\n## ") :]
    for line in body.splitlines():
        if line.startswith("### "):
            assert line[4:] in SECTIONS, line
        elif line.startswith("## "):
            assert re.fullmatch(r"## \[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}", line), line
        elif line:
            assert line.startswith("- "), f"an entry continued over lines: {line!r}"
