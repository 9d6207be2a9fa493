"""Agent profiles: the named agents a server offers, from flags and a config file.

    default, named = parse_agent_flags(["reference", "qwen=qwen --acp"])
    named += load_config("acp-server.toml")
    factories = {p.name: build_factory(p, workspace="/ws", hidden_env=["ACP_SERVER_TOKEN"])
                 for p in merge(default, named)}

``--agent COMMAND`` (no ``NAME=``) sets the default agent; ``--agent NAME=COMMAND``
adds a named one; ``reference`` (the in-process reference agent) is always there.
A config file (TOML) adds profiles with their own environment and working folder::

    [agents.qwen]
    command = ["node", "/opt/qwen/cli.js", "--acp"]   # or one string, split like a shell
    env = { OPENAI_BASE_URL = "http://127.0.0.1:11434/v1" }
    cwd = "/work"                                     # default: the workspace

``unfound(profiles, workspace)`` names the stdio agents whose program cannot be found
(not on the ``PATH`` the child gets, or no executable file at the path given): the
server starts all the same (one may be installed while it runs), and says so.

``--model-server URL`` adds one profile per model the server lists at ``/v1/models``,
named by the model id, served by the in-process model agent (listed at start and again
while the server runs: ``bridge.agents.catalog``, ``Settings.model_factory``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import tomllib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from bridge.agents.base import AgentFactory

if TYPE_CHECKING:
    from bridge.agents.children import ChildRegistry

REFERENCE = "reference"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class ProfileError(ValueError):
    """An invalid profile; the message names it."""


@dataclasses.dataclass(frozen=True, slots=True)
class AgentProfile:
    name: str
    command: tuple[str, ...] = ()          # empty for the reference agent and models
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    model_server: str | None = None        # set for a model-agent profile

    @property
    def kind(self) -> str:
        if self.model_server is not None:
            return "model"
        return "reference" if not self.command else "stdio"


def parse_agent_flag(value: str) -> tuple[str | None, str]:
    """``NAME=COMMAND`` → (NAME, COMMAND); anything else → (None, value)."""
    name, sep, command = value.partition("=")
    if sep and _NAME.fullmatch(name) and " " not in name:
        return name, command
    return None, value


def _command(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ProfileError(f"Invalid agent: {value!r}. Must be 'reference' or a command "
                               f"line ({exc}).") from None
    elif isinstance(value, list) and all(isinstance(a, str) for a in value):
        argv = list(value)
    else:
        raise ProfileError(f"Invalid agent {name!r}: command must be a string or a list of strings.")
    if not argv:
        raise ProfileError(f"Invalid agent: {value!r}. Must be 'reference' or a command line.")
    return () if argv == [REFERENCE] else tuple(argv)


def profile(name: str, command: Any, *, env: Mapping[str, str] | None = None,
            cwd: str | None = None) -> AgentProfile:
    if not _NAME.fullmatch(name):
        raise ProfileError(f"Invalid agent name {name!r}: use letters, digits and ._:- only.")
    return AgentProfile(name, _command(name, command),
                        tuple(sorted((env or {}).items())), cwd)


def parse_agent_flags(values: Iterable[str]) -> tuple[AgentProfile, list[AgentProfile]]:
    """The default profile and the named ones from repeated ``--agent`` values."""
    default = AgentProfile(REFERENCE)
    named: list[AgentProfile] = []
    for value in values:
        name, command = parse_agent_flag(value)
        if name is None:
            argv = _command("default", command)
            default = AgentProfile(REFERENCE if not argv else os.path.basename(argv[0]), argv)
        else:
            named.append(profile(name, command))
    return default, named


def load_config(path: str) -> list[AgentProfile]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"Invalid config {path!r}: {exc}") from None
    agents = data.get("agents", {})
    if not isinstance(agents, dict):
        raise ProfileError(f"Invalid config {path!r}: [agents] must be a table.")
    profiles = []
    for name, table in agents.items():
        if not isinstance(table, dict) or "command" not in table:
            raise ProfileError(f"Invalid agent {name!r} in {path!r}: needs a command.")
        env = table.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ProfileError(f"Invalid agent {name!r} in {path!r}: env must map names to strings.")
        cwd = table.get("cwd")
        if cwd is not None and not (isinstance(cwd, str) and os.path.isdir(cwd)):
            raise ProfileError(f"Invalid agent {name!r} in {path!r}: cwd must be an existing folder.")
        profiles.append(profile(name, table["command"], env=env, cwd=cwd))
    return profiles


def merge(default: AgentProfile, named: Iterable[AgentProfile]) -> list[AgentProfile]:
    """Default first, then the named ones; ``reference`` always present; names unique."""
    result = [default]
    seen = {default.name}
    for item in [*named, AgentProfile(REFERENCE)]:
        if item.name in seen:
            if item.name == REFERENCE and not item.command:
                continue
            raise ProfileError(f"Duplicate agent name {item.name!r}.")
        seen.add(item.name)
        result.append(item)
    return result


def unfound(profiles: Iterable[AgentProfile], workspace: str) -> list[tuple[str, str]]:
    """(agent name, program) for each stdio profile whose program cannot be found: a
    bare name searched on the ``PATH`` the child gets (its profile's, else the
    server's), a path taken from the agent's working folder."""
    missing = []
    for item in profiles:
        if item.kind != "stdio":
            continue
        program = item.command[0]
        if os.sep in program:
            path = os.path.join(item.cwd or workspace, program)
            found = os.path.isfile(path) and os.access(path, os.X_OK)
        else:
            search = dict(item.env).get("PATH", os.environ.get("PATH", os.defpath))
            found = shutil.which(program, path=search) is not None
        if not found:
            missing.append((item.name, program))
    return missing


def build_factory(item: AgentProfile, *, workspace: str, hidden_env: Iterable[str] = (),
                  registry: ChildRegistry | None = None,
                  model_options: Mapping[str, Any] | None = None) -> AgentFactory:
    """The factory of one profile; a stdio child inherits the server's environment
    plus the profile's ``env``, minus ``hidden_env``; a model agent gets
    ``model_options`` (``ModelAgentFactory``'s keyword arguments)."""
    if item.kind == "reference":
        from bridge.agents.reference import ReferenceAgentFactory

        return ReferenceAgentFactory()
    if item.kind == "model":
        from bridge.agents.model import ModelAgentFactory

        assert item.model_server is not None
        return ModelAgentFactory(item.model_server, model=item.name, name=item.name,
                                 **(model_options or {}))
    from bridge.agents.stdio import StdioAgentFactory

    return StdioAgentFactory(list(item.command), cwd=item.cwd or workspace, env=dict(item.env),
                             unset_env=hidden_env, name=item.name, registry=registry)
