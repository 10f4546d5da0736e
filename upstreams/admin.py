from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from upstreams.models import UpstreamDrift


@admin.register(UpstreamDrift)
class UpstreamDriftAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("upstream", "tool", "kind", "detail", "seen", "last_seen", "resolved_at")
    list_filter = ("upstream", "kind", ("resolved_at", admin.EmptyFieldListFilter))
    search_fields = ("upstream", "tool")
    ordering = ("-last_seen",)
    readonly_fields = ("upstream", "tool", "kind", "detail", "first_seen", "last_seen", "seen")
    actions = ("resolve",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Recorded by the calls that meet it, never made up.
        return False

    @admin.action(description="Mark resolved (the declarations or the upstream put right)")
    def resolve(self, request: HttpRequest, queryset: QuerySet[UpstreamDrift]) -> None:
        queryset.filter(resolved_at=None).update(resolved_at=timezone.now())
