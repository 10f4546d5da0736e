"""The managers' rollups: calls counted by hour and by UTC day, decisions on held calls in a daily
histogram, and the rejections still waiting for a fix.

They came from dispatch and keep its tables (dispatch_callrollup, ...): moving them changed the
models' home, not the data.
"""

from __future__ import annotations

from django.db import models

from dispatch.models import Agent


class CallCounts(models.Model):
    """What a rollup row counts of the calls of one agent, tool and code in its period."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+", db_index=False)
    tool = models.CharField(max_length=128)
    code = models.CharField(max_length=64)
    calls = models.PositiveIntegerField(default=0)
    replayed = models.PositiveIntegerField(default=0)
    # Rejections the model can fix, and how many of them it did fix within its next 3 calls.
    correctable = models.PositiveIntegerField(default=0)
    recovered = models.PositiveIntegerField(default=0)

    class Meta:
        abstract = True


class CallRollup(CallCounts):
    """Calls counted per hour, agent, tool and code (analytics/rollups.py fills them from the
    audit records; `manage.py rebuild_rollups` recomputes them)."""

    hour = models.DateTimeField()

    class Meta:
        db_table = "dispatch_callrollup"
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "agent", "tool", "code"], name="rollup_per_hour_agent_tool_code"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.tool} {self.code}: {self.calls}"


class CallRollupDay(CallCounts):
    """The hourly rollups summed by UTC day, filled with the hour's rows.

    A month is then 30 rows a kind of call, not 720: long ranges read days, and hours only at
    their ends (analytics/selectors.py).
    """

    day = models.DateField()

    class Meta:
        db_table = "dispatch_callrollupday"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "agent", "tool", "code"], name="rollup_per_day_agent_tool_code"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.tool} {self.code}: {self.calls}"


class DecisionRollup(models.Model):
    """Decided held calls counted per UTC day of the hold, agent, tool, who decided and how long
    it took, in fixed buckets (analytics/decisions.py), filled from the confirmations' event log;
    `manage.py rebuild_rollups` recomputes them."""

    day = models.DateField()
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+", db_index=False)
    tool = models.CharField(max_length=64)
    # The reviewer's name as the decision's event has it; empty for an expiry.
    decided_by = models.CharField(max_length=150)
    bucket = models.PositiveSmallIntegerField()
    decisions = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "dispatch_decisionrollup"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "agent", "tool", "decided_by", "bucket"],
                name="decisions_per_day_agent_tool_decider_bucket",
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.day} {self.tool} {self.decided_by or 'expiry'} #{self.bucket}: {self.decisions}"
        )


class PendingRecovery(models.Model):
    """A rejection the model can fix, until its session's next 3 calls pass it by or fix it."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+", db_index=False)
    session_id = models.CharField(max_length=128)
    step = models.PositiveIntegerField()
    tool = models.CharField(max_length=128)
    code = models.CharField(max_length=64)
    # The rejection's hour, whose rollup row counts its recovery.
    hour = models.DateTimeField()

    class Meta:
        db_table = "dispatch_pendingrecovery"
        indexes = [models.Index(fields=["agent", "session_id"], name="pending_recovery_session")]

    def __str__(self) -> str:
        return f"{self.session_id} step {self.step} {self.tool} {self.code}"


class FillProgress(models.IntegerChoices):
    DONE = 1
    # Rows past last_id may have been counted by something other than a fill (the release before
    # the fills counted every call in its own statement): the next fill refills them whole.
    STARTED = 2


class FillState(models.Model):
    """How far the fills have counted one kind of row into the rollups (the shape of Zulip's
    analytics FillState): everything up to last_id, the last audit record (`calls`) or
    confirmation event (`decisions`) counted. Each fill moves it in the transaction that writes
    the rows it counted (analytics/fills.py)."""

    property = models.CharField(max_length=40, unique=True)
    last_id = models.BigIntegerField(default=0)
    # Every row that arrived before it was counted (and some after it: those before the lag).
    end_time = models.DateTimeField()
    state = models.PositiveSmallIntegerField(choices=FillProgress.choices)
    # When a fill last moved it: a reader compares it before and after its reads.
    last_modified = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.property} up to #{self.last_id} ({FillProgress(self.state).label})"
