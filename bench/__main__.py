"""``python -m bench [bridge] [http]`` — run the benchmarks and print a Markdown report."""

from __future__ import annotations

import importlib
import platform
import sys

SECTIONS = {"bridge": "bench.bridge_bench", "http": "bench.http_bench", "h2": "bench.h2_bench",
            "heads": "bench.heads_bench", "acp": "bench.acp_bench",
            "lmsp": "bench.lmsp_bench", "journal": "bench.journal_bench",
            "fleet": "bench.fleet_bench"}


def main(argv: list[str]) -> None:
    wanted = argv or list(SECTIONS)
    print(f"# acp-server benchmarks ({platform.python_implementation()} {platform.python_version()}, "
          f"{platform.machine()})\n")
    for name in wanted:
        module = importlib.import_module(SECTIONS[name])
        print("\n".join(module.main()))
        print()
    from bench.targets import summary

    print("\n".join(summary()))


if __name__ == "__main__":
    main(sys.argv[1:])
