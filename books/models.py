"""What the reconciler keeps: where its last runs stopped, and the breaches it found."""

from __future__ import annotations

from django.db import models


class BooksWatermark(models.Model):
    """One row: how far the reconciler's runs read each table it follows (books/reconciler.py).

    `marks` is {table: [older, newer]}: the highest id of the table at the start of the run
    before last and of the last run. A run reads the rows above `older`, so each id is read by
    two runs in a row: a row whose transaction committed after one run started, with an id
    below that run's mark, is still read by the next."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    marks = models.JSONField(default=dict)
    checked_at = models.DateTimeField(null=True, blank=True)
    # When the last full sweep ended.
    swept_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="books_watermark_singleton"),
        ]

    def __str__(self) -> str:
        return f"books checked at {self.checked_at}, swept at {self.swept_at}"


class Breach(models.Model):
    """One invariant of the books found broken for one subject (an order, a confirmation, a
    customer's window): kept for good, found again by each full sweep while it stands."""

    invariant = models.CharField(max_length=64)
    subject = models.CharField(max_length=200)
    detail = models.TextField()
    # Where an administrator looks first: a page of the site.
    look_at = models.CharField(max_length=300, blank=True, default="")
    first_found_at = models.DateTimeField()
    last_found_at = models.DateTimeField()
    # Found by a full sweep (a change no run followed, such as a direct UPDATE) or by a run over
    # what changed.
    by_sweep = models.BooleanField(default=False)

    class Meta:
        ordering = ["-last_found_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["invariant", "subject"], name="breach_once_a_subject"),
        ]

    def __str__(self) -> str:
        return f"{self.invariant} {self.subject}"
