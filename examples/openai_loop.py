"""An OpenAI model whose tool calls go through Toolgate, up to a refund a reviewer must approve.

    TOOLGATE_TOKEN=... OPENAI_API_KEY=... python examples/openai_loop.py "ORD-1001 broke"

Also read: TOOLGATE_URL (http://127.0.0.1:8000), TOOLGATE_CUSTOMER (the customer your host
authenticated; CUS-1), OPENAI_MODEL (gpt-5.4-mini), and OPENAI_BASE_URL, as the SDK reads it.
"""

import os
import sys
from typing import Any

from openai import OpenAI

from toolgate_client import Toolgate

URL = os.environ.get("TOOLGATE_URL", "http://127.0.0.1:8000").rstrip("/")
MODEL = os.environ.get("OPENAI_MODEL", "gpt-5.4-mini")
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
    required("OPENAI_API_KEY", "your OpenAI API key, which the SDK reads")
    toolgate = Toolgate(URL, token, customer_id=os.environ.get("TOOLGATE_CUSTOMER", "CUS-1"))
    model = OpenAI()  # OPENAI_API_KEY, and OPENAI_BASE_URL if set
    tools: Any = toolgate.tools("openai")  # "strict": true where the schema allows it
    messages: list[Any] = [
        {"role": "system", "content": "You are a support agent. Act through the tools."},
        {"role": "user", "content": ASK},
    ]
    for _ in range(10):
        reply = model.chat.completions.create(model=MODEL, messages=messages, tools=tools)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            print(f"Model: {message.content}")
            return 0
        for call in message.tool_calls:
            if call.type != "function":
                continue
            # The model's raw argument text: Toolgate judges exactly what the model wrote.
            result = toolgate.call(call.function.name, call.function.arguments)
            print(f"{call.function.name}({call.function.arguments}) -> {result.code}")
            text = result.model_text
            if result.held and result.confirmation_id:
                print(f"Held for a reviewer: {URL}/approvals/{result.confirmation_id}/")
                decided = toolgate.wait(result.confirmation_id)
                print(f"Decided: {decided.status}")
                text = decided.model_text
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    print("Stopped after 10 turns.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
