"""The service's one tool registry; domain apps register their tools into it when they load."""

from __future__ import annotations

from dispatch.pipeline.tools import ToolRegistry

tool_registry = ToolRegistry()
