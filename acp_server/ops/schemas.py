"""JSON Schemas for every public wire type, generated from the msgspec Structs.

    python -m acp_server.ops.schemas schemas            # (re)write schemas/*.json
    python -m acp_server.ops.schemas --check schemas    # exit 1 when a file is stale

A public wire type is a ``msgspec.Struct`` defined (not imported) in one of
``WIRE_MODULES`` whose name does not start with ``_``. Each is written to
``schemas/<module>.<Name>.json``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterator

import msgspec

WIRE_MODULES = ("bridge.wire", "bridge.jsonrpc", "acp_server.rest.wire", "acp_server.lmsp.wire")


def wire_types() -> Iterator[tuple[str, type[msgspec.Struct]]]:
    for module_name in WIRE_MODULES:
        module = importlib.import_module(module_name)
        for name, obj in sorted(vars(module).items()):
            if (isinstance(obj, type) and issubclass(obj, msgspec.Struct)
                    and obj.__module__ == module_name and not name.startswith("_")):
                yield f"{module_name}.{name}", obj


def render() -> dict[str, str]:
    """File name → file text for every wire type."""
    files = {}
    for qualified, struct in wire_types():
        schema = msgspec.json.schema(struct)
        schema["$id"] = f"https://acp-server.invalid/schemas/{qualified}.json"
        files[f"{qualified}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return files


def stale(directory: str) -> list[str]:
    """Files that are missing, different, or no longer generated."""
    expected = render()
    present = {n for n in os.listdir(directory) if n.endswith(".json")} if os.path.isdir(directory) else set()
    problems = sorted(present - expected.keys())
    for name, text in expected.items():
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            problems.append(name)
        else:
            with open(path, encoding="utf-8") as fh:
                if fh.read() != text:
                    problems.append(name)
    return problems


def write(directory: str) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    expected = render()
    for name in os.listdir(directory):
        if name.endswith(".json") and name not in expected:
            os.remove(os.path.join(directory, name))
    for name, text in expected.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    return sorted(expected)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    directory = args[0] if args else "schemas"
    if check:
        problems = stale(directory)
        for name in problems:
            print(f"stale schema: {directory}/{name}", file=sys.stderr)
        return 1 if problems else 0
    for name in write(directory):
        print(f"wrote {directory}/{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
