"""Agent frameworks nobody here wrote, pinned in pyproject's dev extras, driven against a live
Toolgate MCP server over streamable HTTP with docs/mcp.md's settings: a refusal reaches the model
as the tool's result (its model_text, with its code), not as an exception or a retry, and each
names its conversation so that a retry is replayed in it.

- pydantic-ai: MCPToolset(..., tool_error_behavior="failed"), the conversation in `_meta` from
  process_tool_call;
- the OpenAI Agents SDK: MCPServerStreamableHttp, whose failures are results by default, the
  conversation in `_meta` from tool_meta_resolver;
- LangChain (langchain.mcp): an isError result is a ToolMessage with status "error" by default,
  the conversation in X-Toolgate-Session on the adapter's client.

A refund held for a human reaches the model as the held text, its confirmation_id in it; once a
reviewer approved, the model's get_confirmation_status with that id answers the executed result.

The model is scripted (each framework's own stand-in, or a Model of the SDK's interface): it asks
for the calls a model would, and the tests read what it was handed back.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from agents import Agent as OpenAIAgent
from agents import ModelResponse as OpenAIResponse
from agents import Runner, Usage
from agents.items import ToolCallOutputItem
from agents.mcp import MCPServerStreamableHttp, MCPToolMetaContext
from agents.models.interface import Model
from django.contrib.auth.models import User
from fastmcp import Client as FastMCPClient
from fastmcp.client.transports import StreamableHttpTransport
from langchain.mcp import MCPAdapter
from langchain_core.messages import ToolMessage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
from openai.types.responses import ResponseOutputText as OutputText
from pydantic_ai import Agent, RunContext
from pydantic_ai.mcp import CallToolFunc, MCPToolset, ToolResult
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from approvals.services import confirmation_approve
from dispatch import mcp
from tests.conftest import Ledger, MakeAgent
from tests.dispatch.test_mcp import REFUND, TOOLS, agent_of, audit, mcp_url
from tests.dispatch.test_status_polls import reviewer

__all__ = ["mcp_url", "reviewer"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

# A float where minor units are asked for: refused with INVALID_ARGUMENTS and its hint.
FLOAT_REFUND = {**REFUND, "amount_cents": 25.9}
# Above the line: held for a human.
HELD = {**REFUND, "amount_cents": 9000}
STATUS = "get_confirmation_status"

# A model's step: a tool and its arguments (or how it reads them from what it was given), or
# None to answer the user and end the turn.
Step = tuple[str, dict[str, Any] | Callable[[str], dict[str, Any]]] | None


def held_confirmation(given: str) -> str:
    """The confirmation_id in the held text a model was handed (the last, if several)."""
    found = re.findall(r"held for human approval as confirmation (\w+) until", given)
    assert found, given
    return str(found[-1])


def status_of_the_held_call(given: str) -> dict[str, Any]:
    return {"confirmation_id": held_confirmation(given)}


def assert_executed(data: dict[str, Any], confirmation_id: str) -> None:
    assert (data["confirmation_id"], data["status"], data["final"]) == (
        confirmation_id,
        "executed",
        True,
    )
    assert (data["result"]["ok"], data["result"]["code"]) == (True, "OK")


def headers(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", mcp.CUSTOMER_HEADER: "CUS-1", **extra}


# pydantic-ai ------------------------------------------------------------------------------------


@dataclass
class Conversation:
    """What the host knows of the conversation it runs the agent for (the agent's deps)."""

    id: str


async def name_the_conversation(
    ctx: RunContext[Conversation], call_tool: CallToolFunc, name: str, args: dict[str, Any]
) -> ToolResult:
    return await call_tool(name, args, metadata={mcp.CONVERSATION_META: ctx.deps.id})


def scripted(*calls: Step) -> FunctionModel:
    """A model that takes each step in turn, then ends."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked = sum(isinstance(m, ModelResponse) for m in messages)
        step = calls[asked] if asked < len(calls) else None
        if step is None:
            return ModelResponse(parts=[TextPart("Told the user.")])
        name, arguments = step
        if callable(arguments):
            given = [part.model_response_str() for part in handed_back(messages)]
            arguments = arguments("\n".join(given))
        return ModelResponse(parts=[ToolCallPart(name, arguments)])

    return FunctionModel(respond)


def pydantic_ai_run(url: str, token: str, toolset_options: dict[str, Any], *calls: Any) -> Any:
    toolset = MCPToolset(
        FastMCPClient(StreamableHttpTransport(url, headers=headers(token))),
        process_tool_call=name_the_conversation,
        **toolset_options,
    )
    agent = Agent(scripted(*calls), deps_type=Conversation, toolsets=[toolset])
    return agent.run_sync("Refund ORD-1001.", deps=Conversation("conv-pydantic-ai"))


def handed_back(messages: list[ModelMessage]) -> list[Any]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart | RetryPromptPart)
    ]


def test_pydantic_ai_hands_a_refusal_to_the_model_as_a_failed_result(
    mcp_url: str, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS)[1]

    run = pydantic_ai_run(
        mcp_url,
        token,
        {"tool_error_behavior": "failed"},
        ("refund_order", FLOAT_REFUND),
        ("refund_order", REFUND),
        ("refund_order", REFUND),
    )

    refused, refund, retry = handed_back(run.all_messages())
    assert isinstance(refused, ToolReturnPart) and refused.outcome == "failed"
    assert "INVALID_ARGUMENTS" in refused.model_response_str()
    assert "2590 for 25.90" in refused.model_response_str()
    contents: list[Any] = [refund.content, retry.content]
    assert contents[0]["code"] == "OK" and contents[1]["replayed"] is True
    assert {r.session_id for r in audit(agent_of(token))} == {"conv-pydantic-ai"}
    assert ledger.state() == (1, 1000)


def test_pydantic_ai_by_default_turns_a_refusal_into_a_retry_prompt(
    mcp_url: str, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS)[1]

    run = pydantic_ai_run(mcp_url, token, {"max_retries": 2}, ("refund_order", FLOAT_REFUND))

    refused = handed_back(run.all_messages())[0]
    # What the setting above is for: a retry that spends the tool's retry budget.
    assert refused.outcome == "retried" and refused.retry.cause == "model_retry"
    assert ledger.state() == (0, 0)


def test_pydantic_ai_hands_the_held_text_to_the_model_which_asks_for_the_outcome(
    mcp_url: str, make_agent: MakeAgent, reviewer: User, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS)[1]
    toolset = MCPToolset(
        FastMCPClient(StreamableHttpTransport(mcp_url, headers=headers(token))),
        process_tool_call=name_the_conversation,
        tool_error_behavior="failed",
    )
    model = scripted(("refund_order", HELD), None, (STATUS, status_of_the_held_call))
    agent = Agent(model, deps_type=Conversation, toolsets=[toolset])
    conversation = Conversation("conv-pydantic-ai-held")

    first = agent.run_sync("Refund ORD-1001.", deps=conversation)
    [held] = handed_back(first.all_messages())
    confirmation_id = held_confirmation(held.model_response_str())
    confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)
    later = agent.run_sync(
        "Is my refund done?", deps=conversation, message_history=first.all_messages()
    )

    assert held.outcome == "success" and held.content["code"] == "CONFIRMATION_REQUIRED"
    outcome = handed_back(later.new_messages())[0]
    assert outcome.tool_name == STATUS and outcome.outcome == "success"
    assert_executed(outcome.content["data"], confirmation_id)
    assert ledger.state() == (1, 9000)


# The OpenAI Agents SDK --------------------------------------------------------------------------


class ScriptedModel(Model):
    """A model of the SDK's interface that asks for each call in turn, then ends."""

    def __init__(self, *calls: Step) -> None:
        self.calls = list(calls)
        self.turn = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> OpenAIResponse:
        self.turn += 1
        step = self.calls[self.turn - 1] if self.turn <= len(self.calls) else None
        if step is not None:
            name, arguments = step
            if callable(arguments):
                # What the model was given: the conversation so far, tool outputs included.
                arguments = arguments(json.dumps(kwargs.get("input", args[1:2])))
            item: Any = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call-{self.turn}",
                name=name,
                arguments=json.dumps(arguments),
            )
        else:
            item = ResponseOutputMessage(
                id="message",
                type="message",
                role="assistant",
                status="completed",
                content=[OutputText(type="output_text", text="Told the user.", annotations=[])],
            )
        return OpenAIResponse(output=[item], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        # The SDK's Model declares it; Runner.run never streams, so any use is the test's fault.
        raise AssertionError("the agent was run streamed; these tests run it with Runner.run")


def output_text(output: Any) -> str:
    """The text the SDK hands the model for a tool's output (one text block, as a dict)."""
    return str(output["text"]) if isinstance(output, dict) else str(output)


def conversation_meta(context: MCPToolMetaContext) -> dict[str, Any]:
    conversation: Conversation = context.run_context.context
    return {mcp.CONVERSATION_META: conversation.id}


def test_the_openai_agents_sdk_hands_a_refusal_to_the_model_as_the_tools_output(
    mcp_url: str, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS)[1]

    async def run() -> list[str]:
        async with MCPServerStreamableHttp(
            {"url": mcp_url, "headers": headers(token)},
            name="toolgate",
            tool_meta_resolver=conversation_meta,
        ) as server:
            agent = OpenAIAgent[Conversation](
                name="support",
                model=ScriptedModel(
                    ("refund_order", FLOAT_REFUND),
                    ("refund_order", REFUND),
                    ("refund_order", REFUND),
                ),
                mcp_servers=[server],
            )
            result = await Runner.run(
                agent, "Refund ORD-1001.", context=Conversation("conv-agents-sdk")
            )
        return [
            output_text(item.output)
            for item in result.new_items
            if isinstance(item, ToolCallOutputItem)
        ]

    refused, refund, retry = asyncio.run(run())

    assert refused.startswith("ERROR INVALID_ARGUMENTS refund_order")
    assert "2590 for 25.90" in refused
    assert refund.startswith("OK refund_order")
    assert retry.startswith("REPLAY")
    assert {r.session_id for r in audit(agent_of(token))} == {"conv-agents-sdk"}
    assert ledger.state() == (1, 1000)


def test_the_openai_agents_sdk_hands_the_held_text_to_the_model_which_asks_for_the_outcome(
    mcp_url: str, make_agent: MakeAgent, reviewer: User, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS)[1]
    model = ScriptedModel(("refund_order", HELD), None, (STATUS, status_of_the_held_call))
    conversation = Conversation("conv-agents-sdk-held")

    async def run(input: Any) -> Any:
        async with MCPServerStreamableHttp(
            {"url": mcp_url, "headers": headers(token)},
            name="toolgate",
            tool_meta_resolver=conversation_meta,
        ) as server:
            agent = OpenAIAgent[Conversation](name="support", model=model, mcp_servers=[server])
            return await Runner.run(agent, input, context=conversation)

    def outputs(result: Any) -> list[str]:
        return [
            output_text(item.output)
            for item in result.new_items
            if isinstance(item, ToolCallOutputItem)
        ]

    first = asyncio.run(run("Refund ORD-1001."))
    [held] = outputs(first)
    confirmation_id = held_confirmation(held)
    confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)
    later = asyncio.run(
        run([*first.to_input_list(), {"role": "user", "content": "Is my refund done?"}])
    )

    assert held.startswith("PENDING refund_order")
    [outcome] = outputs(later)
    assert outcome.startswith(f"OK {STATUS}")
    assert_executed(json.loads(outcome.split(": ", 1)[1]), confirmation_id)
    assert ledger.state() == (1, 9000)


# LangChain -------------------------------------------------------------------------------------


def test_langchain_hands_a_refusal_to_the_model_as_an_error_tool_message(
    mcp_url: str, make_agent: MakeAgent, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS)[1]
    # One adapter for the conversation, its id in the header: each call's connection is then in
    # the same Toolgate session, though LangChain opens one for every call.
    client = FastMCPClient(
        StreamableHttpTransport(
            mcp_url, headers=headers(token, **{mcp.SESSION_HEADER: "conv-langchain"})
        )
    )

    async def run() -> list[ToolMessage]:
        tools = {tool.name: tool for tool in await MCPAdapter(client).list_tools()}
        refund = tools["refund_order"]
        return [
            await refund.ainvoke(
                {"type": "tool_call", "name": "refund_order", "args": arguments, "id": f"c{n}"}
            )
            for n, arguments in enumerate((FLOAT_REFUND, REFUND, REFUND))
        ]

    refused, refund, retry = asyncio.run(run())

    assert refused.status == "error"
    assert refused.content[0]["text"].startswith("ERROR INVALID_ARGUMENTS refund_order")  # type: ignore[index]
    assert refund.status == "success" and refund.artifact["structured_content"]["code"] == "OK"
    assert retry.artifact["structured_content"]["replayed"] is True
    assert {r.session_id for r in audit(agent_of(token))} == {"conv-langchain"}
    assert ledger.state() == (1, 1000)


def test_langchain_hands_the_held_text_to_the_model_and_the_outcome_once_approved(
    mcp_url: str, make_agent: MakeAgent, reviewer: User, ledger: Ledger
) -> None:
    token = make_agent(allowed_tools=TOOLS)[1]
    client = FastMCPClient(
        StreamableHttpTransport(
            mcp_url, headers=headers(token, **{mcp.SESSION_HEADER: "conv-langchain-held"})
        )
    )

    async def invoke(name: str, arguments: dict[str, Any]) -> ToolMessage:
        tools = {tool.name: tool for tool in await MCPAdapter(client).list_tools()}
        call = {"type": "tool_call", "name": name, "args": arguments, "id": name}
        message: ToolMessage = await tools[name].ainvoke(call)
        return message

    held = asyncio.run(invoke("refund_order", HELD))
    confirmation_id = held_confirmation(held.content[0]["text"])  # type: ignore[index]
    confirmation_approve(confirmation_id=confirmation_id, reviewer=reviewer)
    outcome = asyncio.run(invoke(STATUS, {"confirmation_id": confirmation_id}))

    assert held.status == "success"
    assert held.artifact["structured_content"]["code"] == "CONFIRMATION_REQUIRED"
    assert outcome.status == "success"
    assert_executed(outcome.artifact["structured_content"]["data"], confirmation_id)
    assert ledger.state() == (1, 9000)
