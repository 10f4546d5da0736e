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
from dispatch.money import AmountInvalid, major_units, minor_units
from dispatch.pipeline.policy import CurrencyLimits, HumanRule
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
    "auto_approve_window_seconds",
    "step_budget",
    "repeat_limit",
    "confirmation_ttl_seconds",
    "duplicate_lookback_seconds",
)
# What a version shows of its money, in major units per currency, and of its tools' rules.
_POLICY_SHOWN = ("thresholds", "human_rules_shown")


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
    fields = ("version", "allowed_tools", *_POLICY_SHOWN, *_POLICY_FIELDS[1:], "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ("-version",)

    @admin.display(description="thresholds")
    def thresholds(self, obj: Policy) -> str:
        return policy_thresholds_text(obj)

    @admin.display(description="human")
    def human_rules_shown(self, obj: Policy) -> str:
        return human_rules_text(obj)

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


def policy_thresholds_text(policy: Policy) -> str:
    """A version's money thresholds in major units, one currency a line."""
    limits = policy.limits()
    if limits is None:
        return "one set for every currency (made before thresholds were kept per currency)"
    lines = []
    for currency, each in limits.items():
        lines.append(
            f"{currency}: max {_major(each.max_amount_cents, currency)}, no human below "
            f"{_major(each.auto_approve_below_cents, currency)}, two reviewers from "
            f"{_major(each.two_reviewers_from_cents, currency, 'never')}, daily cap "
            f"{_major(each.daily_cap_cents, currency, 'none')}, approvals ask once more above "
            f"{_major(each.confirm_above_cents, currency, 'never')}, a second factor above "
            f"{_major(each.factor_above_cents, currency, 'never')}"
        )
    return "; ".join(lines) + "; any other currency is held for a human"


def human_rules_text(policy: Policy) -> str:
    rules = policy.human_rules or {}
    shown = ", ".join(f"{tool}: {rule.replace('_', ' ')}" for tool, rule in sorted(rules.items()))
    return shown or "by amount for high-risk tools, never for the others"


def _major(cents: int | None, currency: str, none: str = "none") -> str:
    return none if cents is None else major_units(cents, currency)


# The per-currency thresholds of the form, as their fields are named: CUR_<name>.
_THRESHOLDS = {
    "max_amount": ("max amount a call", False),
    "auto_approve_below": ("no human below", False),
    "two_reviewers_from": ("two reviewers from", True),
    "daily_cap": ("daily cap without a human", True),
    "confirm_above": ("approvals ask once more above", True),
    "factor_above": ("approvals need a second factor above", True),
}
_RULE_CHOICES = [
    ("", "by amount if high risk, else never"),
    *[(rule.value, rule.value.replace("_", " ")) for rule in HumanRule],
]


class PolicyVersionForm(forms.ModelForm):  # type: ignore[type-arg]
    """A new version: its tools, their human rules, and its thresholds per currency in each
    currency's major units (50.00 BRL, 5000 JPY, 5.000 KWD)."""

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
        field.choices = [
            (spec.name, f"{spec.name}: {spec.label}{' (retired)' if spec.retired else ''}")
            for spec in tool_registry
        ]
        for spec in tool_registry:
            self.fields[f"human_{spec.name}"] = forms.ChoiceField(
                choices=_RULE_CHOICES, required=False, label=f"human for {spec.name}"
            )
        for currency in self.currencies():
            for name, (label, nullable) in _THRESHOLDS.items():
                self.fields[f"{currency}_{name}"] = forms.CharField(
                    required=False,
                    label=f"{currency} {label}",
                    help_text=f"in {currency}'s major units"
                    + (
                        "; empty for none"
                        if nullable
                        else "; leave every box of a currency "
                        "empty to hold all its calls for a human"
                    ),
                )

    def currencies(self) -> list[str]:
        """The currencies the domains' tools move money in, and any the current version has."""
        current = self.initial.get("currency_limits") or {}
        return sorted(set(tool_registry.currencies) | {currency.upper() for currency in current})

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        limits: dict[str, CurrencyLimits] = {}
        for currency in self.currencies():
            values = {name: (data.get(f"{currency}_{name}") or "").strip() for name in _THRESHOLDS}
            if not any(values.values()):
                continue
            try:
                limits[currency] = CurrencyLimits(
                    max_amount_cents=self._minor(currency, "max_amount", values, positive=True),
                    auto_approve_below_cents=self._minor(currency, "auto_approve_below", values),
                    two_reviewers_from_cents=self._minor(currency, "two_reviewers_from", values),
                    daily_cap_cents=self._minor(currency, "daily_cap", values),
                    confirm_above_cents=self._minor(currency, "confirm_above", values),
                    factor_above_cents=self._minor(currency, "factor_above", values),
                )
            except forms.ValidationError as error:
                self.add_error(None, error)
        data["currency_limits"] = limits
        data["human_rules"] = {
            spec.name: data[f"human_{spec.name}"]
            for spec in tool_registry
            if data.get(f"human_{spec.name}")
        }
        return data

    def _minor(
        self, currency: str, name: str, values: dict[str, str], *, positive: bool = False
    ) -> Any:
        text = values[name]
        label, nullable = _THRESHOLDS[name]
        if not text:
            if nullable:
                return None
            raise forms.ValidationError(f"{currency} {label}: give an amount.")
        try:
            amount = minor_units(text, currency)
        except AmountInvalid as exc:
            raise forms.ValidationError(f"{currency} {label}: {exc}.") from None
        if positive and amount < 1:
            raise forms.ValidationError(f"{currency} {label}: more than 0.")
        return amount


_VERSION_NOTE = (
    "A policy version is never edited. To change an agent's policy, add a new version: it is a "
    "draft until another manager approves it (Policy changes), then it becomes the agent's "
    "current policy, and earlier decisions keep the version they were made under."
)


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = PolicyVersionForm
    list_display = (
        "agent",
        "version",
        "is_current",
        "tools",
        "thresholds",
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
    readonly_fields = _POLICY_SHOWN

    def get_fieldsets(self, request: HttpRequest, obj: Policy | None = None) -> Any:
        if obj is not None:
            fields = ("agent", "version", *_POLICY_FIELDS, *_POLICY_SHOWN)
            return [
                (
                    None,
                    {
                        "description": _VERSION_NOTE,
                        "fields": (*fields, "created_at", "created_by"),
                    },
                )
            ]
        currencies = sorted(
            set(tool_registry.currencies)
            | set(self.get_changeform_initial_data(request).get("currency_limits") or {})
        )
        return [
            (None, {"description": _VERSION_NOTE, "fields": ("agent", *_POLICY_FIELDS)}),
            (
                "Who decides each tool's calls",
                {"fields": tuple(f"human_{spec.name}" for spec in tool_registry)},
            ),
            (
                "Money thresholds per currency, in its major units",
                {
                    "description": "A currency left empty has no thresholds: every call in it "
                    "is held for a human. Amounts use the currency's own decimals: 50.00 BRL, "
                    "5000 JPY, 5.000 KWD.",
                    "fields": tuple(
                        tuple(f"{currency}_{name}" for name in _THRESHOLDS)
                        for currency in currencies
                    ),
                },
            ),
        ]

    def get_form(
        self, request: HttpRequest, obj: Policy | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        # The model's own fields; the thresholds and the rules are the form's (made per currency
        # and per tool as it starts).
        if obj is None:
            kwargs["fields"] = ("agent", *_POLICY_FIELDS)
        return super().get_form(request, obj, change, **kwargs)

    @admin.display(description="thresholds")
    def thresholds(self, policy: Policy) -> str:
        return policy_thresholds_text(policy)

    @admin.display(description="who decides each tool's calls")
    def human_rules_shown(self, policy: Policy) -> str:
        return human_rules_text(policy)

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
        initial: dict[str, Any] = dict(super().get_changeform_initial_data(request))
        agent_id = str(request.GET.get("agent", ""))
        if agent_id.isdigit():
            agent = Agent.objects.select_related("current_policy").filter(pk=int(agent_id)).first()
            if agent is not None and agent.current_policy is not None:
                current = agent.current_policy
                initial.update({name: getattr(current, name) for name in _POLICY_FIELDS})
                initial["currency_limits"] = current.currency_limits or {}
                for currency, limits in (current.limits() or {}).items():
                    for name in _THRESHOLDS:
                        cents = getattr(limits, f"{name}_cents")
                        if cents is not None:
                            initial[f"{currency}_{name}"] = major_units(cents, currency)
                for tool, rule in (current.human_rules or {}).items():
                    initial[f"human_{tool}"] = rule
        return initial

    def save_model(self, request: HttpRequest, obj: Policy, form: Any, change: bool) -> None:
        created = policy_create(
            agent=obj.agent,
            allowed_tools=obj.allowed_tools,
            currencies=form.cleaned_data["currency_limits"],
            humans=form.cleaned_data["human_rules"],
            auto_approve_window_seconds=obj.auto_approve_window_seconds,
            step_budget=obj.step_budget,
            repeat_limit=obj.repeat_limit,
            confirmation_ttl_seconds=obj.confirmation_ttl_seconds,
            duplicate_lookback_seconds=obj.duplicate_lookback_seconds,
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
