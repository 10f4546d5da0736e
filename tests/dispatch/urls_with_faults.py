"""The project's URLs, and endpoints under the API's prefix that fail on purpose: the tests of
failures need something that fails where nothing in the product does."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response

from dispatch.apis import AgentApi
from toolgate import urls


class FaultApi(AgentApi):
    def get(self, request: Request) -> Response:
        raise RuntimeError("a fault on purpose, in an API view")


def plain_fault(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a fault on purpose, outside DRF")


def plain_query(request: HttpRequest) -> HttpResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return HttpResponse("read")


urlpatterns = [
    path("api/v1/test/fault", FaultApi.as_view()),
    path("api/v1/test/plain-fault", plain_fault),
    path("api/v1/test/plain-query", plain_query),
    *urls.urlpatterns,
]

handler400 = urls.handler400
handler500 = urls.handler500
