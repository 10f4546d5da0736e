"""Agents, their policy versions, sessions and the records of calls, for operators.

Records are shown and never written here: the pipeline writes them, once. A policy changes only
by a new version, made through `policy_create` like everywhere else.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from dispatch.models import (
    Agent,
    AuditRecord,
    IdempotencyRecord,
    Policy,
    SecurityEvent,
    Session,
)
from dispatch.registry import tool_registry
from dispatch.services import policy_create
from dispatch.webhooks import (
    WebhookUrlInvalid,
    agent_webhook_secret_rotate,
    agent_webhook_set,
    webhook_target,
)

_POLICY_FIELDS = (
    "allowed_tools",
    "max_amount_cents",
    "auto_approve_below_cents",
    "auto_approve_window_seconds",
    "daily_cap_cents",
    "two_reviewers_from_cents",
    "step_budget",
    "repeat_limit",
    "confirmation_ttl_seconds",
)


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Shown, filtered and searched; never added, changed or deleted from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PolicyInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Policy
    fk_name = "agent"
    fields = ("version", *_POLICY_FIELDS, "created_at", "created_by")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ("-version",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AgentForm(forms.ModelForm):  # type: ignore[type-arg]
    # Checked by dispatch.webhooks alone: Django's URLField would add a scheme to what it got.
    webhook_url = forms.CharField(
        required=False,
        max_length=500,
        label="Webhook URL",
        help_text="where decisions and results of this agent's confirmations are POSTed, signed "
        "(docs/webhooks.md); https, and a public address. Empty for none.",
    )

    class Meta:
        model = Agent
        fields = ("name", "is_active", "webhook_url")

    def clean_webhook_url(self) -> str:
        url = str(self.cleaned_data.get("webhook_url") or "").strip()
        if url:
            try:
                webhook_target(url)
            except WebhookUrlInvalid as exc:
                raise forms.ValidationError(str(exc)) from None
        return url


_SECRETS_TEMPLATE = "admin/dispatch/agent/webhook_secrets.html"


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = AgentForm
    list_display = (
        "name",
        "token_prefix",
        "is_active",
        "policy_version",
        "webhook_url",
        "created_at",
    )
    list_filter = ("is_active",)
    list_select_related = ("current_policy",)
    search_fields = ("name", "token_prefix")
    # token_hash is never shown: it is all an attacker would need to look for a matching token;
    # nor is the webhook secret, shown once when it is made.
    fields = ("name", "is_active", "token_prefix", "policy", "webhook_url", "webhook", "created_at")
    readonly_fields = ("token_prefix", "policy", "webhook", "created_at")
    inlines = (PolicyInline,)
    actions = ("disable_agents", "enable_agents", "rotate_webhook_secrets")

    def has_add_permission(self, request: HttpRequest) -> bool:
        # The token must be shown once, to the one who creates the agent: `create_agent` does.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Agent | None = None) -> bool:
        # Audit records and confirmations refer to the agent; disable it instead.
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        note = (
            "Create an agent with `manage.py create_agent NAME --tools ...`, which shows its "
            "token once. Disable an agent rather than delete it: its records refer to it."
        )
        return super().changelist_view(request, {"subtitle": note, **(extra_context or {})})

    @admin.display(description="policy", ordering="current_policy__version")
    def policy_version(self, agent: Agent) -> str:
        return f"v{agent.current_policy.version}" if agent.current_policy else "-"

    @admin.display(description="current policy")
    def policy(self, agent: Agent) -> str:
        add_url = reverse("admin:dispatch_policy_add") + "?" + urlencode({"agent": agent.pk})
        if agent.current_policy is None:
            return format_html('none (<a href="{}">add one</a>)', add_url)
        view_url = reverse("admin:dispatch_policy_change", args=[agent.current_policy.pk])
        return format_html(
            '<a href="{}">v{}</a> (versions are never edited: <a href="{}">add a new version</a>)',
            view_url,
            agent.current_policy.version,
            add_url,
        )

    @admin.display(description="webhook secret")
    def webhook(self, agent: Agent) -> str:
        if not agent.webhook_secret:
            return "none (one is made, and shown once, when a webhook URL is set)"
        return "set (shown once when it was made; the 'rotate' action makes a new one)"

    def save_model(self, request: HttpRequest, obj: Agent, form: Any, change: bool) -> None:
        url = obj.webhook_url
        url_changed = "webhook_url" in form.changed_data
        if url_changed:
            # The webhook is set by its service, which also makes or drops the secret.
            obj.webhook_url = str(form.initial.get("webhook_url") or "")
        super().save_model(request, obj, form, change)
        if not url_changed:
            return
        try:
            secret = agent_webhook_set(agent=obj, url=url)
        except WebhookUrlInvalid as exc:
            # The host resolved elsewhere since the form was checked.
            self.message_user(request, f"The webhook was not changed: {exc}", messages.ERROR)
            return
        if secret is not None:
            request._webhook_secrets = [(obj, secret)]  # type: ignore[attr-defined]

    def response_change(self, request: HttpRequest, obj: Agent) -> HttpResponse:
        secrets = getattr(request, "_webhook_secrets", None)
        if secrets:
            # Shown on this answer and nowhere else: not through messages, which may keep it in
            # a cookie.
            return self._show_secrets(request, secrets)
        return super().response_change(request, obj)

    def _show_secrets(self, request: HttpRequest, secrets: list[tuple[Agent, str]]) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Webhook secrets",
            "secrets": secrets,
            "changelist_url": reverse("admin:dispatch_agent_changelist"),
        }
        # Admin views are never cached (no-store), so the page is not kept either.
        return TemplateResponse(request, _SECRETS_TEMPLATE, context)

    @admin.action(description="Make new webhook secrets for the selected agents (shown once)")
    def rotate_webhook_secrets(
        self, request: HttpRequest, queryset: QuerySet[Agent]
    ) -> HttpResponse | None:
        secrets = [
            (agent, agent_webhook_secret_rotate(agent=agent))
            for agent in queryset.exclude(webhook_url="")
        ]
        if not secrets:
            self.message_user(request, "None of the selected agents has a webhook.", messages.ERROR)
            return None
        return self._show_secrets(request, secrets)

    @admin.action(description="Disable the selected agents (their tokens stop working)")
    def disable_agents(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        changed = queryset.filter(is_active=True).update(is_active=False)
        self.message_user(request, f"Disabled {changed} agent(s).", messages.SUCCESS)

    @admin.action(description="Enable the selected agents")
    def enable_agents(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        changed = queryset.filter(is_active=False).update(is_active=True)
        self.message_user(request, f"Enabled {changed} agent(s).", messages.SUCCESS)


class PolicyVersionForm(forms.ModelForm):  # type: ignore[type-arg]
    allowed_tools = forms.MultipleChoiceField(
        widget=forms.CheckboxSelectMultiple, required=False, help_text="the tools it may call"
    )

    class Meta:
        model = Policy
        fields = ("agent", *_POLICY_FIELDS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Read here, not at import: domain apps register their tools when they are ready.
        field = self.fields["allowed_tools"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = [(spec.name, f"{spec.name}: {spec.label}") for spec in tool_registry]

    def clean_max_amount_cents(self) -> int:
        value = int(self.cleaned_data["max_amount_cents"])
        if value < 1:
            raise forms.ValidationError("At least 1 cent.")
        return value


_VERSION_NOTE = (
    "A policy version is never edited. To change an agent's policy, add a new version: it "
    "becomes the agent's current policy, and earlier decisions keep the version they were made "
    "under."
)


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = PolicyVersionForm
    list_display = (
        "agent",
        "version",
        "is_current",
        "tools",
        "max_amount_cents",
        "auto_approve_below_cents",
        "two_reviewers_from_cents",
        "step_budget",
        "repeat_limit",
        "confirmation_ttl_seconds",
        "created_at",
        "created_by",
    )
    list_filter = ("agent",)
    list_select_related = ("agent", "created_by")
    search_fields = ("agent__name",)
    ordering = ("agent__name", "-version")

    def get_fieldsets(self, request: HttpRequest, obj: Policy | None = None) -> Any:
        if obj is None:
            return [(None, {"description": _VERSION_NOTE, "fields": ("agent", *_POLICY_FIELDS)})]
        return [
            (
                None,
                {
                    "description": _VERSION_NOTE,
                    "fields": ("agent", "version", *_POLICY_FIELDS, "created_at", "created_by"),
                },
            )
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return super().changelist_view(
            request, {"subtitle": _VERSION_NOTE, **(extra_context or {})}
        )

    def has_change_permission(self, request: HttpRequest, obj: Policy | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Policy | None = None) -> bool:
        return False

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        """Adding a version for an agent starts from its current policy."""
        initial = dict(super().get_changeform_initial_data(request))
        agent_id = str(request.GET.get("agent", ""))
        if agent_id.isdigit():
            agent = Agent.objects.select_related("current_policy").filter(pk=int(agent_id)).first()
            if agent is not None and agent.current_policy is not None:
                current = agent.current_policy
                initial.update({name: getattr(current, name) for name in _POLICY_FIELDS})
        return initial

    def save_model(self, request: HttpRequest, obj: Policy, form: Any, change: bool) -> None:
        created = policy_create(
            agent=obj.agent,
            allowed_tools=obj.allowed_tools,
            max_amount_cents=obj.max_amount_cents,
            auto_approve_below_cents=obj.auto_approve_below_cents,
            auto_approve_window_seconds=obj.auto_approve_window_seconds,
            daily_cap_cents=obj.daily_cap_cents,
            two_reviewers_from_cents=obj.two_reviewers_from_cents,
            step_budget=obj.step_budget,
            repeat_limit=obj.repeat_limit,
            confirmation_ttl_seconds=obj.confirmation_ttl_seconds,
            created_by=request.user if isinstance(request.user, User) else None,
        )
        # The admin goes on with `obj` (its message, its log entry, its redirect).
        obj.pk = created.pk
        obj.version = created.version
        obj.created_at = created.created_at
        obj.created_by = created.created_by
        obj._state.adding = False
        obj._state.db = created._state.db

    @admin.display(boolean=True, description="current")
    def is_current(self, policy: Policy) -> bool:
        return policy.agent.current_policy_id == policy.pk

    @admin.display(description="allowed tools")
    def tools(self, policy: Policy) -> str:
        return ", ".join(policy.allowed_tools)


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    list_display = (
        "session_id",
        "agent",
        "customer_id",
        "steps",
        "calls",
        "created_at",
        "last_call_at",
    )
    list_filter = ("agent",)
    list_select_related = ("agent",)
    search_fields = ("session_id", "customer_id")
    ordering = ("-last_call_at",)

    @admin.display(description="calls")
    def calls(self, session: Session) -> str:
        url = (
            reverse("admin:dispatch_auditrecord_changelist")
            + "?"
            + urlencode({"agent__id__exact": session.agent_id, "session_id": session.session_id})
        )
        return format_html('<a href="{}">audit records</a>', url)


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "short_key",
        "agent",
        "session_id",
        "tool",
        "status",
        "attempts",
        "confirmation_id",
        "updated_at",
    )
    list_filter = ("tool", "status", "agent")
    list_select_related = ("agent",)
    search_fields = ("session_id", "key", "confirmation_id")
    ordering = ("-updated_at",)

    @admin.display(description="key", ordering="key")
    def short_key(self, record: IdempotencyRecord) -> str:
        return f"{record.key[:16]}…"


@admin.register(AuditRecord)
class AuditRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "at",
        "call_id",
        "agent",
        "session_id",
        "customer_id",
        "step",
        "tool",
        "code",
        "ok",
        "replayed",
        "channel",
        "duration_ms",
    )
    list_filter = ("ok", "code", "tool", "replayed", "channel", "agent")
    list_select_related = ("agent",)
    search_fields = ("session_id", "call_id", "customer_id", "confirmation_id")
    date_hierarchy = "at"
    ordering = ("-at", "-id")


@admin.register(SecurityEvent)
class SecurityEventAdmin(ReadOnlyAdmin):
    """Refused requests of the agent API and the MCP server: a burst from one address, or of one
    reason, stands out when filtered."""

    list_display = (
        "at",
        "channel",
        "status",
        "reason",
        "agent",
        "client_address",
        "method",
        "path",
        "detail",
    )
    list_filter = ("channel", "status", "reason", "agent")
    list_select_related = ("agent",)
    search_fields = ("client_address", "path", "detail")
    date_hierarchy = "at"
    ordering = ("-at", "-id")
