"""The project's URLs, and next to them the bare endpoint that benchmark (b) compares against.

The bare endpoint is what an API without Toolgate's pipeline looks like: a DRF view with the same
authentication, permission and throttle classes as the agent API (the same token lookup, one
query), which parses the JSON body and inserts one row. What it lacks is the pipeline.
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response

from bench.models import BareCall
from dispatch.apis import AgentApi
from toolgate.urls import urlpatterns as project_urlpatterns


def _text(value: Any, limit: int) -> str:
    return (value if isinstance(value, str) else str(value))[:limit]


class BareCallApi(AgentApi):
    def post(self, request: Request) -> Response:
        data = request.data if isinstance(request.data, dict) else {}
        row = BareCall.objects.create(
            agent=self.agent(request),
            session_id=_text(data.get("session_id", ""), 128),
            tool=_text(data.get("tool", ""), 128),
            arguments=_text(data.get("arguments", ""), 4096),
        )
        return Response({"id": row.pk, "ok": True})


urlpatterns = [
    *project_urlpatterns,
    path("bench/bare", BareCallApi.as_view(), name="bench-bare"),
]
