"""The deterministic core of Toolgate.

A tool call goes in as plain values and a result comes out as plain values; persistence, HTTP and
background work are the adapters' business. Nothing here imports Django, DRF or Celery.
"""

from dispatch.pipeline.codes import Code, CodeCatalogue
from dispatch.pipeline.engine import Pipeline
from dispatch.pipeline.policy import Policy
from dispatch.pipeline.results import CallResult
from dispatch.pipeline.state import InMemoryState, StatePort
from dispatch.pipeline.tools import ToolCall, ToolRegistry, ToolSpec

__all__ = [
    "CallResult",
    "Code",
    "CodeCatalogue",
    "InMemoryState",
    "Pipeline",
    "Policy",
    "StatePort",
    "ToolCall",
    "ToolRegistry",
    "ToolSpec",
]
