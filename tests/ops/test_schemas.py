"""The checked-in JSON Schemas match the msgspec wire types (run `make schemas`)."""

from __future__ import annotations

import pathlib

from acp_server.ops import schemas

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_wire_module_has_types():
    modules = {name.rsplit(".", 1)[0] for name, _ in schemas.wire_types()}
    assert modules == set(schemas.WIRE_MODULES)


def test_schemas_are_fresh():
    problems = schemas.stale(str(ROOT / "schemas"))
    assert problems == [], f"stale schemas {problems}: run `make schemas`"


def test_event_envelope_schema_names_the_wire_fields():
    text = schemas.render()["bridge.wire.EventEnvelope.json"]
    for field in ('"_meta"', '"promptId"', '"type"', '"data"', '"v"'):
        assert field in text
