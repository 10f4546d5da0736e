"""The bare endpoint's one table (the `bench` app is installed only by bench.settings)."""

from __future__ import annotations

from django.db import models


class BareCall(models.Model):
    """What a bare endpoint would keep of a call: who sent it, where, and what."""

    agent = models.ForeignKey("dispatch.Agent", on_delete=models.CASCADE, related_name="+")
    session_id = models.CharField(max_length=128)
    tool = models.CharField(max_length=128)
    arguments = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # Declared, as the app is installed only by bench.settings (not by the type checker's).
    objects: models.Manager[BareCall] = models.Manager()

    class Meta:
        app_label = "bench"

    def __str__(self) -> str:
        return f"{self.session_id} {self.tool}"
