"""Loading the declared upstreams (settings.TOOLGATE_UPSTREAMS) into the tool registry.

Each entry names a declarations module, which defines:

- UPSTREAM: its HttpUpstream (upstreams.http), or its McpStdioUpstream or McpHttpUpstream
  (upstreams.mcp);
- tools(upstream): its ToolSpecs, in the shape of a hosted tool's;
- CURRENCIES (optional): the currencies its tools move money in.

Only the tools a module declares are exposed, whatever else the upstream offers; each must name
operations its reviewed OpenAPI document offers (or tools its reviewed input schemas describe),
or Toolgate does not start.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any, Protocol

from dispatch.pipeline.tools import ToolRegistry, ToolSpec
from upstreams.http import HttpUpstream, Upstream
from upstreams.mcp import McpHttpUpstream, McpStdioUpstream, McpUpstream
from upstreams.tools import UpstreamDeclarationError, UpstreamWrite, upstream_tools


class Declarations(Protocol):
    """What a declarations module defines."""

    @property
    def UPSTREAM(self) -> HttpUpstream | McpStdioUpstream | McpHttpUpstream: ...

    def tools(self, upstream: Any, /) -> Iterable[ToolSpec[Any] | UpstreamWrite]: ...


AnyUpstream = Upstream | McpUpstream


# The upstreams loaded, by name: what the drift check compares.
loaded: dict[str, tuple[AnyUpstream, tuple[ToolSpec[Any], ...]]] = {}


def upstream_load(module: Declarations | str) -> tuple[AnyUpstream, tuple[ToolSpec[Any], ...]]:
    """An upstream connected as its declarations module says, and its tools as served."""
    if isinstance(module, str):
        module = _imported(module)
    declared = module.UPSTREAM
    upstream: AnyUpstream
    try:
        if isinstance(declared, McpStdioUpstream | McpHttpUpstream):
            # Connected on first use: a command run (or a connection opened) at start-up would
            # be in every process.
            upstream = McpUpstream(declared)
        else:
            upstream = Upstream(declared)
    except (LookupError, ValueError) as error:
        raise UpstreamDeclarationError(str(error)) from None
    return upstream, upstream_tools(upstream, module.tools(upstream))


def upstream_register(
    module: Declarations | str, registry: ToolRegistry
) -> tuple[AnyUpstream, tuple[ToolSpec[Any], ...]]:
    """Load an upstream and register its tools and currencies."""
    if isinstance(module, str):
        module = _imported(module)
    upstream, specs = upstream_load(module)
    for spec in specs:
        registry.register(spec)
    registry.register_currencies(getattr(module, "CURRENCIES", ()))
    loaded[upstream.name] = (upstream, specs)
    return upstream, specs


def upstream_unregister(name: str, registry: ToolRegistry) -> None:
    """Withdraw an upstream's tools."""
    upstream, specs = loaded.pop(name, (None, ()))
    for spec in specs:
        registry.unregister(spec.name)
    if isinstance(upstream, McpUpstream):
        upstream.close()


def upstreams_register(modules: Iterable[str], registry: ToolRegistry) -> None:
    for module in modules:
        upstream_register(module, registry)


def _imported(name: str) -> Declarations:
    imported: Declarations = importlib.import_module(name)
    return imported
