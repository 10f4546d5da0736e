"""The MCP server: the agent's tools over the Model Context Protocol, with the pipeline inside.

A thin adapter, as the API is: what the model never chooses (the agent, the session, the
customer) comes from the host, and every tools/call runs the same pipeline as
`POST /api/v1/calls`. One module a concern:

- `transport`: serving over stdio and streamable HTTP (the ASGI app uvicorn runs), and the HTTP
  transport's authentication;
- `sessions`: how a request maps to Toolgate's agent, session and customer, and the host's
  refusals;
- `tools`: the registry's tools as MCP tools (schemas, annotations, instructions), and the server
  that lists and calls them;
- `results`: a CallResult, or a refusal, as MCP content, structured content and isError;
- `tasks`: a held call as a task (protocol 2025-11-25): the task-augmented tools/call, and
  tasks/get, tasks/result and tasks/cancel (which withdraws it);
- `messages`: each message read as strict JSON before the SDK reads it, on both transports.
"""

from dispatch.mcp.results import refusal_error, result_schema
from dispatch.mcp.sessions import (
    CONVERSATION_META,
    CUSTOMER_HEADER,
    CUSTOMER_META,
    HTTP_PATH,
    MCP_SESSION_HEADER,
    SESSION_HEADER,
    SESSION_VARIABLE,
    STDIO_PATH,
    Host,
    stdio_origin,
)
from dispatch.mcp.tools import server_instructions, tool_call
from dispatch.mcp.transport import TOKEN_VARIABLE, http_app, refuse_stdio, serve_stdio

__all__ = [
    "CONVERSATION_META",
    "CUSTOMER_HEADER",
    "CUSTOMER_META",
    "HTTP_PATH",
    "MCP_SESSION_HEADER",
    "SESSION_HEADER",
    "SESSION_VARIABLE",
    "STDIO_PATH",
    "TOKEN_VARIABLE",
    "Host",
    "http_app",
    "refusal_error",
    "refuse_stdio",
    "result_schema",
    "serve_stdio",
    "server_instructions",
    "stdio_origin",
    "tool_call",
]
