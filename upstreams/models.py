"""What an upstream did that its declarations did not say, found while serving (drift at run
time): recorded once per upstream, tool and kind for administrators, each later sighting counted
on the same row. `manage.py check_upstreams` compares whole schemas; this is what calls met."""

from __future__ import annotations

from django.db import models

from upstreams import drift_records


class DriftKind(models.TextChoices):
    # A declared tool the upstream no longer lists: its calls are refused.
    TOOL_MISSING = drift_records.TOOL_MISSING, "Declared tool not offered"
    # A success whose body is not the declared answer's shape (a read refused, a write unknown).
    ANSWER_SHAPE = drift_records.ANSWER_SHAPE, "Answer not of the declared shape"
    # A declared MCP tool whose arguments the server now describes differently: its calls refused.
    INPUT_SCHEMA = drift_records.INPUT_SCHEMA, "Arguments described differently"


class UpstreamDrift(models.Model):
    upstream = models.CharField(max_length=64)
    # The upstream's operation or tool (not Toolgate's tool name).
    tool = models.CharField(max_length=128)
    kind = models.CharField(max_length=32, choices=DriftKind.choices)
    # What was found, in Toolgate's words (field names only, never the upstream's values).
    detail = models.CharField(max_length=300)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    seen = models.PositiveIntegerField(default=1)
    # Set by an administrator once the declarations or the upstream were put right; seen again,
    # it is open again.
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "upstream drift"
        verbose_name_plural = "upstream drift"
        constraints = [
            models.UniqueConstraint(
                fields=["upstream", "tool", "kind"], name="upstream_drift_once"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.upstream} {self.tool}: {self.get_kind_display()}"
