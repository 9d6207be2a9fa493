"""Real third-party clients from the npm registry, installed on first use into the
agent cache (``tests/npm.py``); skipped, with the reason, only without node/npm."""

from __future__ import annotations

import pytest

from tests.npm import installed

QWEN_SDK_PACKAGE = "@qwen-code/sdk@0.1.14"
ACP_SDK_PACKAGE = "@agentclientprotocol/sdk@2.4.0"


def _folder(package: str) -> str:
    name = package.rsplit("@", 1)[0]
    return installed(package, f"{name}/package.json").removesuffix("/package.json")


@pytest.fixture(scope="session")
def qwen_sdk() -> str:
    """The folder of ``@qwen-code/sdk``."""
    return _folder(QWEN_SDK_PACKAGE)


@pytest.fixture(scope="session")
def acp_sdk() -> str:
    """The folder of ``@agentclientprotocol/sdk``."""
    return _folder(ACP_SDK_PACKAGE)
