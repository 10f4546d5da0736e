"""Agents and their policies, sessions, idempotency records, held calls and the audit trail."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex, OpClass
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models.functions import Upper

from dispatch.pipeline.allowance import execution_key
from dispatch.pipeline.policy import CurrencyLimits, HumanRule
from dispatch.pipeline.policy import Policy as PolicySnapshot
from dispatch.pipeline.state import KeyStatus


class Agent(models.Model):
    """An agent host. Its token is shown once, at creation, and kept only as a SHA-256 hash."""

    name = models.CharField(max_length=100, unique=True)
    # The token's first characters, to tell tokens apart in the admin without storing them.
    token_prefix = models.CharField(max_length=12)
    # Tokens are 256-bit random strings, so a fast hash is as strong as a slow one here.
    token_hash = models.CharField(max_length=64, unique=True)
    is_active = models.BooleanField(default=True)
    current_policy = models.ForeignKey(
        "dispatch.Policy",
        on_delete=models.PROTECT,
        related_name="+",
        null=True,
        blank=True,
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Where decisions and final results of this agent's confirmations are POSTed (dispatch.webhooks
    # validates it), signed with the secret. The secret is kept as it is, not hashed: signing needs
    # it. It is shown once, when it is made.
    webhook_url = models.URLField(max_length=500, blank=True, default="")
    webhook_secret = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_authenticated(self) -> bool:
        # DRF's IsAuthenticated asks this of request.user; an agent that authenticated is one.
        return True


class Policy(models.Model):
    """One version of an agent's policy. Versions are never edited: a change is a new version.

    The money thresholds are kept per currency in its minor units (`currency_limits`); a
    currency without thresholds is held for a human. Versions made before that keep one set of
    numbers for every currency (the flat columns), and are judged as they were.
    """

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="policies")
    version = models.PositiveIntegerField()
    allowed_tools = models.JSONField(default=list)
    # {currency: {max_amount_cents, auto_approve_below_cents, two_reviewers_from_cents,
    # daily_cap_cents}}; null in a version made before thresholds were kept per currency.
    currency_limits = models.JSONField(null=True, blank=True)
    # {tool: "never" | "always" | "by_amount"}; a tool not here: by amount if it is high risk.
    human_rules = models.JSONField(default=dict, blank=True)
    # The thresholds of a version made before they were kept per currency.
    max_amount_cents = models.PositiveBigIntegerField(null=True, blank=True)
    auto_approve_below_cents = models.PositiveBigIntegerField(null=True, blank=True)
    auto_approve_window_seconds = models.PositiveIntegerField(
        default=24 * 3600,
        validators=[MinValueValidator(60)],
        help_text="the customer's sum counts what moved within this many seconds",
    )
    daily_cap_cents = models.PositiveBigIntegerField(null=True, blank=True)
    two_reviewers_from_cents = models.PositiveBigIntegerField(null=True, blank=True)
    step_budget = models.PositiveIntegerField(default=50, validators=[MinValueValidator(1)])
    repeat_limit = models.PositiveIntegerField(default=3, validators=[MinValueValidator(1)])
    confirmation_ttl_seconds = models.PositiveIntegerField(
        default=24 * 3600, validators=[MinValueValidator(60)]
    )
    # How far back a call's possible duplicates are sought (dispatch/pipeline/allowance.py);
    # null: the confirmation's lifetime plus TOOLGATE_IDEMPOTENCY_KEEP_SECONDS, so that a call
    # sent again once its key was pruned still finds what the first one moved.
    duplicate_lookback_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(60)],
        help_text="possible duplicates are sought this many seconds back (never less than the "
        "window); empty: the confirmation's lifetime plus the idempotency keys' keep time",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Kept: the application's database role may not update a version (disable a user instead).
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["agent", "-version"]
        verbose_name_plural = "policies"
        constraints = [
            models.UniqueConstraint(fields=["agent", "version"], name="policy_version_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} v{self.version}"

    def limits(self) -> dict[str, CurrencyLimits] | None:
        """The thresholds per currency; None for a version that keeps one set for all."""
        if self.currency_limits is None:
            return None
        return {
            currency: CurrencyLimits(**values)
            for currency, values in sorted(self.currency_limits.items())
        }

    def duplicate_lookback(self) -> int:
        """How far back, in seconds, a call's possible duplicates are sought."""
        if self.duplicate_lookback_seconds is not None:
            return self.duplicate_lookback_seconds
        keep: int = settings.TOOLGATE_IDEMPOTENCY_KEEP_SECONDS
        return self.confirmation_ttl_seconds + keep

    def snapshot(self) -> PolicySnapshot:
        return PolicySnapshot(
            version=self.version,
            allowed_tools=frozenset(self.allowed_tools),
            max_amount_cents=self.max_amount_cents or 0,
            auto_approve_below_cents=self.auto_approve_below_cents or 0,
            auto_approve_window_seconds=self.auto_approve_window_seconds,
            daily_cap_cents=self.daily_cap_cents,
            two_reviewers_from_cents=self.two_reviewers_from_cents,
            step_budget=self.step_budget,
            repeat_limit=self.repeat_limit,
            confirmation_ttl_seconds=self.confirmation_ttl_seconds,
            duplicate_lookback_seconds=self.duplicate_lookback(),
            currencies=self.limits(),
            humans={tool: HumanRule(rule) for tool, rule in (self.human_rules or {}).items()},
        )


class Session(models.Model):
    """A conversation of an agent, bound on its first call to the customer the host vouched for."""

    # Indexed by the (agent, session_id) constraint: a second index would only slow inserts.
    agent = models.ForeignKey(
        Agent, on_delete=models.CASCADE, related_name="sessions", db_index=False
    )
    session_id = models.CharField(max_length=128)
    customer_id = models.CharField(max_length=64)
    steps = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    last_call_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent", "session_id"], name="session_per_agent"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} ({self.customer_id})"


class IdempotencyRecord(models.Model):
    """One per idempotency key: how often it was sent, where it stands, what to replay."""

    key = models.CharField(max_length=64, primary_key=True)
    # A call finds its record by key; the retention finds a session's records by
    # idempotency_session_idx, which leads with the agent.
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+", db_index=False)
    session_id = models.CharField(max_length=128)
    tool = models.CharField(max_length=64)
    # The key's status as the core's decision table names it (dispatch.pipeline.state.KeyStatus).
    status = models.CharField(
        max_length=16, choices=[(status.value, status.value) for status in KeyStatus]
    )
    attempts = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    confirmation_id = models.CharField(max_length=32, blank=True, default="")
    confirmation_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # A remote write's (ToolSpec.remote), from when its effect begins: until when the process
    # making it may still be at it (after that an identical call, or settle_outcomes, takes it
    # over), and the call (its arguments, customer and agent) for a read that finds its effect
    # by its arguments (ToolSpec.effect_of).
    lease_until = models.DateTimeField(null=True, blank=True)
    remote_call = models.JSONField(null=True, blank=True)

    class Meta:
        indexes = [
            # A session's records, deleted with it (dispatch/retention.py). Its columns never
            # change, so a key's updates stay heap-only.
            models.Index(fields=["agent", "session_id"], name="idempotency_session_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.key[:12]} {self.status}"


class CallChannel(models.TextChoices):
    """How a call reached the pipeline: the agent API, or the MCP server (`mcp_serve`)."""

    API = "api", "API"
    MCP = "mcp", "MCP"


class SecurityChannel(models.TextChoices):
    """Where a refused request came in: a call's channels, or a person's page."""

    API = "api", "API"
    MCP = "mcp", "MCP"
    WEB = "web", "Pages"
    # Not a request: the reconciler found the books broken (books/reconciler.py).
    BOOKS = "books", "Books"


class AuditRecord(models.Model):
    """One per call, append-only: on PostgreSQL a trigger refuses UPDATE and DELETE."""

    call_id = models.CharField(max_length=32, unique=True)
    at = models.DateTimeField(db_index=True)
    # Indexed by audit_chain_place, which leads with the agent.
    agent = models.ForeignKey(
        Agent, on_delete=models.PROTECT, related_name="audit_records", db_index=False
    )
    session_id = models.CharField(max_length=128)
    customer_id = models.CharField(max_length=64)
    step = models.PositiveIntegerField(null=True)
    tool = models.CharField(max_length=128)
    raw_arguments = models.TextField(blank=True)
    arguments = models.JSONField(null=True, blank=True)
    key = models.CharField(max_length=64, blank=True, default="")
    ok = models.BooleanField()
    code = models.CharField(max_length=64)
    message = models.TextField(blank=True)
    replayed = models.BooleanField(default=False)
    confirmation_id = models.CharField(max_length=32, blank=True, default="")
    policy_version = models.PositiveIntegerField()
    duration_ms = models.FloatField()
    channel = models.CharField(max_length=8, choices=CallChannel.choices, default=CallChannel.API)
    # Its link in its session's chain (dispatch/pipeline/audit_chain.py): its place and hash,
    # and the hash's MAC under the audit key (`<key id>:<hex>`, dispatch/audit_keys.py).
    chain_seq = models.PositiveBigIntegerField(null=True, blank=True)
    chain_hash = models.CharField(max_length=64, blank=True, default="")
    chain_mac = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        ordering = ["at", "id"]
        constraints = [
            # One record at each place of a session's chain; read backwards, the session's head
            # (dispatch/store/sql.py HEAD); and a session's calls.
            models.UniqueConstraint(
                fields=["agent", "session_id", "chain_seq"], name="audit_chain_place"
            ),
        ]
        indexes = [
            models.Index(fields=["tool", "code"], name="audit_tool_code_idx"),
            # A customer's calls, newest first, on the calls page.
            models.Index(fields=["customer_id", "at"], name="audit_customer_idx"),
            # The calls page's search in what the model sent (icontains, which PostgreSQL reads
            # as UPPER(raw_arguments) LIKE ...): a trigram index on the same expression. Made on
            # PostgreSQL only (migration dispatch 0019).
            GinIndex(
                OpClass(Upper("raw_arguments"), name="gin_trgm_ops"),
                name="audit_raw_arguments_trgm",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.call_id} {self.tool} {self.code}"


class ConfirmationStatus(models.TextChoices):
    """Where a held call stands; CONFIRMATION_LIFECYCLE says where it may go from each."""

    PENDING = "pending"
    APPROVED = "approved"
    EXECUTING = "executing"
    EXECUTED = "executed"
    # The execution was refused or failed for certain: nothing moved.
    FAILED = "failed"
    # The execution may have happened: a reviewer reconciles it with the system of record.
    UNKNOWN = "unknown"
    REJECTED = "rejected"
    EXPIRED = "expired"
    # The re-check at approval found that the call no longer passes; nothing executed.
    INVALIDATED = "invalidated"
    # The agent's host withdrew it before any reviewer approved it; nothing executed.
    WITHDRAWN = "withdrawn"
    # A reviewer edited it before approving: the edited call (edited_from names this one) takes
    # its place, its key and its money's place in the customer's sum; nothing of it executes.
    SUPERSEDED = "superseded"


# The one declaration of a confirmation's lifecycle: the statuses each may move to. A row may also
# keep its status while other columns change (a vote's reviewers_required, a lease taken over).
# On PostgreSQL a trigger rendered from it refuses every other move, whoever asks
# (dispatch/store/guards.py); approvals.services makes the moves.
CONFIRMATION_LIFECYCLE: dict[str, frozenset[str]] = {
    ConfirmationStatus.PENDING: frozenset(
        {
            ConfirmationStatus.APPROVED,
            ConfirmationStatus.REJECTED,
            ConfirmationStatus.EXPIRED,
            ConfirmationStatus.INVALIDATED,
            ConfirmationStatus.WITHDRAWN,
            ConfirmationStatus.SUPERSEDED,
        }
    ),
    ConfirmationStatus.APPROVED: frozenset({ConfirmationStatus.EXECUTING}),
    ConfirmationStatus.EXECUTING: frozenset(
        {ConfirmationStatus.EXECUTED, ConfirmationStatus.FAILED, ConfirmationStatus.UNKNOWN}
    ),
    # A reviewer reconciles it with the system of record.
    ConfirmationStatus.UNKNOWN: frozenset({ConfirmationStatus.EXECUTED, ConfirmationStatus.FAILED}),
    ConfirmationStatus.EXECUTED: frozenset(),
    ConfirmationStatus.FAILED: frozenset(),
    ConfirmationStatus.REJECTED: frozenset(),
    ConfirmationStatus.EXPIRED: frozenset(),
    ConfirmationStatus.INVALIDATED: frozenset(),
    ConfirmationStatus.WITHDRAWN: frozenset(),
    ConfirmationStatus.SUPERSEDED: frozenset(),
}

# Settled: nothing follows.
CONFIRMATION_FINAL = frozenset(
    status for status, following in CONFIRMATION_LIFECYCLE.items() if not following
)

# What a held call is, fixed when it is held: what was asked, by whom, for whom, for how much, and
# what the reviewer was shown. On PostgreSQL the lifecycle's trigger refuses to change them;
# every other column (the decision, the execution's lease and outcome, and whatever a later
# release adds) changes as the services need. Its expiry may only come sooner.
CONFIRMATION_FROZEN = (
    "id",
    "key",
    "tool",
    "arguments",
    "arguments_hash",
    "agent",
    "session_id",
    "customer_id",
    "policy_version",
    "amount_cents",
    "currency",
    "hold_reason",
    "host_context",
    "duplicate_of",
    "edited_from",
    "created_at",
)


class Confirmation(models.Model):
    """The exact validated arguments a human is asked about, and everything they were judged by."""

    id = models.CharField(max_length=32, primary_key=True)
    key = models.CharField(max_length=64, db_index=True)
    tool = models.CharField(max_length=64)
    arguments = models.JSONField()
    arguments_hash = models.CharField(max_length=64)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="confirmations")
    session_id = models.CharField(max_length=128)
    customer_id = models.CharField(max_length=64)
    policy_version = models.PositiveIntegerField()
    reviewers_required = models.PositiveSmallIntegerField(default=1)
    amount_cents = models.PositiveBigIntegerField(null=True, blank=True)
    # The currency of its amount, as the tool's money said (from its arguments or its subject).
    currency = models.CharField(max_length=16, blank=True, default="")
    status = models.CharField(
        max_length=16, choices=ConfirmationStatus.choices, default=ConfirmationStatus.PENDING
    )
    result = models.JSONField(null=True, blank=True)
    # Why the policy held it: kind, message and data (the earlier refunds and their sum).
    hold_reason = models.JSONField(null=True, blank=True)
    # What the agent host sent with the call for the reviewer (the envelope's `context`): the
    # customer's own words or the agent's summary. Shown escaped, never interpreted.
    host_context = models.TextField(blank=True, default="")
    # Why it was rejected (the reviewer's words) or invalidated (the re-check's code and message).
    decision_reason = models.TextField(blank=True, default="")
    decision_code = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    # When it was approved, rejected, expired or invalidated.
    decided_at = models.DateTimeField(null=True, blank=True)
    # When a worker claimed it for execution, and when the execution ended.
    executing_since = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The approved row is the outbox of its execution: when its task was last sent to the
    # workers, and until when the worker executing it holds it (renewed while it lives; a lapsed
    # lease is taken over by another worker).
    execution_sent_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # A possible duplicate: the key of the money it may repeat (dispatch.models.Movement), held,
    # approved or executed in another conversation. Approving it takes a reviewer's explicit word.
    duplicate_of = models.CharField(max_length=64, blank=True, default="")
    # The held call a reviewer edited into this one (now superseded): this one keeps its key, and
    # what the model asked is that one's arguments.
    edited_from = models.CharField(max_length=32, blank=True, default="", db_index=True)
    # The head of its event log's chain (approvals.models.ConfirmationEvent), moved with each
    # event under the row's lock.
    event_seq = models.PositiveBigIntegerField(default=0)
    event_head = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(fields=["status", "expires_at"], name="confirmation_queue_idx"),
            # The held calls of a range, counted by status without reading the rows.
            models.Index(
                fields=["created_at"],
                include=["status", "agent", "tool"],
                name="confirmation_created_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.id} ({self.status})"

    @property
    def execution_key(self) -> str:
        """The key its execution passes to the system of record, and its money's key in the
        customer's sum: one per confirmation."""
        return execution_key(self.id)


class MovementApproval(models.TextChoices):
    """How money stands in the customer's sum (dispatch/pipeline/allowance.py)."""

    POLICY = "policy"
    REVIEWER = "reviewer"
    # On its way: held for a reviewer (until its confirmation's expiry), or approved and not yet
    # executed.
    HELD = "held"
    APPROVED = "approved"


class Movement(models.Model):
    """Money a call moved, or reserved to move, without a human or with one.

    What the customer's sum adds up (dispatch/pipeline/allowance.py). A reservation is written
    in its call's transaction, under the customer's money lock that concurrent calls wait on
    until it commits (under an agent's daily cap, in a short transaction of its own before the
    effect; dispatch/store/allowance.py); a call that moves nothing releases it or writes none.
    A held call's money is reserved under its confirmation's execution key when it is held; the
    decision releases it or approves it, and the execution's end turns it into money moved with
    a reviewer or releases it (approvals.services, through dispatch.held_money): one row of
    money per call, never two.
    """

    key = models.CharField(max_length=64, unique=True)
    # No foreign key: the reservation commits apart from the call, and outlives nothing it names.
    agent_id = models.BigIntegerField()
    session_id = models.CharField(max_length=128)
    customer_id = models.CharField(max_length=64)
    currency = models.CharField(max_length=16)
    tool = models.CharField(max_length=64)
    subject = models.CharField(max_length=128)
    amount_cents = models.PositiveBigIntegerField()
    approval = models.CharField(max_length=16, choices=MovementApproval.choices)
    at = models.DateTimeField()
    # The UTC day of `at`, which the agent's daily cap counts by.
    day = models.DateField()
    released_at = models.DateTimeField(null=True, blank=True)
    # Held money stops counting at its confirmation's expiry, unless approved by then.
    expires_at = models.DateTimeField(null=True, blank=True)
    # The held call it is the money of, if a human was asked.
    confirmation_id = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        indexes = [
            models.Index(fields=["customer_id", "currency", "at"], name="movement_customer_idx"),
            models.Index(fields=["agent_id", "currency", "day"], name="movement_agent_day_idx"),
            # The money on its way, which counts whenever it was held: few rows at any time.
            models.Index(
                fields=["customer_id", "currency"],
                condition=models.Q(approval__in=["held", "approved"], released_at__isnull=True),
                name="movement_on_its_way_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.subject} {self.amount_cents} {self.currency} ({self.approval})"


class SecurityEvent(models.Model):
    """A request the agent API or the MCP server refused (400, 401, 403, 409, 413, 415, 422,
    429), or a person's page refused as a matter of security (an author approving their own
    policy change): who, from where, through which door, why.

    Append-only (on PostgreSQL a trigger refuses UPDATE); old rows are pruned, so the table stays
    bounded however many requests are refused (dispatch.security).
    """

    at = models.DateTimeField(db_index=True)
    # Known once the token was; a refused token names no agent.
    agent = models.ForeignKey(
        Agent, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    client_address = models.GenericIPAddressField(null=True, blank=True)
    method = models.CharField(max_length=16)
    path = models.CharField(max_length=200)
    status = models.PositiveSmallIntegerField()
    reason = models.CharField(max_length=64, help_text="the error's code, as the client got it")
    detail = models.CharField(max_length=200, blank=True)
    channel = models.CharField(
        max_length=8, choices=SecurityChannel.choices, default=SecurityChannel.API
    )

    def __str__(self) -> str:
        return f"{self.status} {self.reason} {self.method} {self.path}"


class HostIdempotencyKey(models.Model):
    """An agent host's Idempotency-Key (POST /api/v1/calls) and the final answer it was given.

    Inserted before the call runs, so the unique (agent, key) decides which of two racing requests
    runs; the answer is written in the call's own transaction (dispatch/host_keys.py). Running,
    unfinished (its last answer was not final) or answered (completed_at).
    """

    # Indexed by the (agent, key) constraint.
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=255)
    # What "the same request" means: the customer, the tool and the arguments, not the session.
    request_hash = models.CharField(max_length=64)
    # The session of the key's first request: every run with the key runs in it, so that the
    # pipeline finishes, under its own key, a call whose first answer was not final.
    session_id = models.CharField(max_length=128, blank=True, default="")
    # The last run's answer was not final and no run holds the key: the same request runs again.
    unfinished = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    # The answer's exact JSON text (an unfinished key's last answer, kept for the record): a
    # replay is the final answer byte for byte, which a jsonb column, reordering keys, would not
    # give back.
    response_body = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    # When the run that answers it began; a run that died is taken over and moves it.
    claimed_at = models.DateTimeField(db_index=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent", "key"], name="host_idempotency_key_per_agent"),
        ]

    def __str__(self) -> str:
        state = "answered" if self.completed_at else "unfinished" if self.unfinished else "running"
        return f"{self.agent_id} {self.key[:32]} ({state})"


class AuditSeal(models.Model):
    """The heads of the audit chains that moved, hashed into one, after the previous seal
    (dispatch/audit.py). Also written out where the database's owner cannot rewrite it: this row
    only links the next seal to it."""

    number = models.PositiveBigIntegerField(unique=True)
    at = models.DateTimeField()
    previous = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # [[chain, seq, hash], ...], sorted.
    heads = models.JSONField(default=list)

    class Meta:
        ordering = ["number"]

    def __str__(self) -> str:
        return f"seal {self.number} ({len(self.heads)} chains)"


class AnsweredTask(models.Model):
    """A task-augmented tools/call over MCP that was answered at once (executed, or refused):
    its answer, for `tasks/get` and `tasks/result`, until its ttl ends; the retention deletes it
    then (dispatch/retention.py). A held call's task is its confirmation and needs no row."""

    id = models.CharField(max_length=48, primary_key=True)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    customer_id = models.CharField(max_length=64)
    tool = models.CharField(max_length=64)
    # The tools/call's answer as the client would have had it without a task (CallToolResult).
    result = models.JSONField()
    ok = models.BooleanField()
    created_at = models.DateTimeField()
    # Created, plus its ttl: the client's, capped at TOOLGATE_IDEMPOTENCY_KEEP_SECONDS.
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.tool} {self.id} ({'completed' if self.ok else 'failed'})"
