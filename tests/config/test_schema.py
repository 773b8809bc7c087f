"""The committed catalog ``lit_fedco/config/schema.json`` matches the dataclasses it is generated
from, and the docstring parser reads what the dataclasses document."""

from __future__ import annotations

import dataclasses

from lit_fedco.config.fields import RunConfig
from lit_fedco.config.schema import SCHEMA_FILE, WRITE_COMMAND, attributes, build, dumps, field_docs
from lit_fedco.core.user_models import ModelConfig
from lit_fedco.data.config import DataConfig
from lit_fedco.updaters import DSFedDROHparams, FedAvgCOHparams


def test_committed_schema_is_current():
    expected = dumps(build())
    assert SCHEMA_FILE.read_text(encoding="utf-8") == expected, (
        f"lit_fedco/config/schema.json is stale: run {WRITE_COMMAND}"
    )


def test_attributes_are_parsed_from_google_docstrings():
    doc = """Summary.

    Attributes:
        lr: η, the client step size.
        beta: β ∈ (0, 1], the weight of
            the fresh value (``see`` :class:`~a.b.Thing`).
        a / b: shared text.

    Raises:
        ValueError: not an attribute.
    """
    assert attributes(doc) == {
        "lr": "η, the client step size.",
        "beta": "β ∈ (0, 1], the weight of the fresh value (see Thing).",
        "a": "shared text.",
        "b": "shared text.",
    }
    assert attributes("No sections.") == {}


def test_every_field_is_described_and_subclasses_override_their_bases():
    docs = field_docs(DSFedDROHparams)
    assert docs["lr"] == "η, the client step size."  # from DistributedHparams
    assert docs["beta"].startswith("β ∈ (0, 1], the moving-average weight")  # its own
    assert field_docs(FedAvgCOHparams)["case"].startswith('"I"')
    catalog = build()
    nodes = catalog["nodes"]
    for cls, node in [
        (RunConfig, catalog["run"]),
        (DataConfig, nodes["data"]),
        (ModelConfig, nodes["model"]),
    ]:
        leaves = [f.name for f in dataclasses.fields(cls) if f.name in node["keys"]]
        assert all(node["keys"][k]["help"] for k in leaves)
    for name, node in catalog["nodes"].items():
        assert node["help"], name
        for key, spec in node["keys"].items():
            assert spec["help"] and "\n" not in spec["help"], f"{name}.{key}"
