"""The one place that turns a schema failure into words a model can act on.

Every failing field gets `field: problem (hint from the field's description)`.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError


def describe_validation_error(model: type[BaseModel], error: ValidationError) -> str:
    fields = model.model_fields
    parts: list[str] = []
    for item in error.errors(include_url=False, include_context=False):
        location = item["loc"]
        name = ".".join(str(part) for part in location) or "arguments"
        top = location[0] if location else None
        if item["type"] == "extra_forbidden":
            hint: str | None = f"the only fields are: {', '.join(fields)}"
        elif isinstance(top, str) and top in fields:
            hint = fields[top].description
        else:
            hint = None
        parts.append(f"{name}: {item['msg']} ({hint})" if hint else f"{name}: {item['msg']}")
    return "; ".join(parts)
