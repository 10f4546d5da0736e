"""An Anthropic model whose tool calls go through Toolgate, up to a refund a reviewer must approve.

    TOOLGATE_TOKEN=... ANTHROPIC_API_KEY=... python examples/anthropic_loop.py "ORD-1001 broke"

Also read: TOOLGATE_URL (http://127.0.0.1:8000), TOOLGATE_CUSTOMER (the customer your host
authenticated; CUS-1), ANTHROPIC_MODEL (claude-sonnet-5-5), and ANTHROPIC_BASE_URL, as the SDK
reads it.
"""

import os
import sys
from typing import Any

from anthropic import Anthropic

from toolgate_client import Toolgate

URL = os.environ.get("TOOLGATE_URL", "http://127.0.0.1:8000").rstrip("/")
MODEL = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-5-5")
ASK = " ".join(sys.argv[1:]) or "Order ORD-1001 arrived damaged. Please refund R$ 80,00."


def required(name: str, what: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        sys.exit(f"Set {name}: {what}.")
    return value


def main() -> int:
    token = required(
        "TOOLGATE_TOKEN", "the agent's token (make demo prints the demo agent's, with the URL)"
    )
    required("ANTHROPIC_API_KEY", "your Anthropic API key, which the SDK reads")
    toolgate = Toolgate(URL, token, customer_id=os.environ.get("TOOLGATE_CUSTOMER", "CUS-1"))
    model = Anthropic()  # ANTHROPIC_API_KEY, and ANTHROPIC_BASE_URL if set
    tools: Any = toolgate.tools("anthropic")
    messages: list[Any] = [{"role": "user", "content": ASK}]
    for _ in range(10):
        reply = model.messages.create(
            model=MODEL,
            max_tokens=1024,
            system="You are a support agent. Act through the tools.",
            tools=tools,
            messages=messages,
        )
        messages.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            print("Model: " + " ".join(b.text for b in reply.content if b.type == "text"))
            return 0
        results = []
        for block in reply.content:
            if block.type != "tool_use":
                continue
            result = toolgate.call(block.name, block.input)
            print(f"{block.name}({block.input}) -> {result.code}")
            text, ok = result.model_text, result.ok or result.held
            if result.held and result.confirmation_id:
                print(f"Held for a reviewer: {URL}/approvals/{result.confirmation_id}/")
                decided = toolgate.wait(result.confirmation_id)
                print(f"Decided: {decided.status}")
                text, ok = decided.model_text, decided.status == "executed"
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": block.id,
                    "content": text,
                    "is_error": not ok,
                }
            )
        messages.append({"role": "user", "content": results})
    print("Stopped after 10 turns.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
