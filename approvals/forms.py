"""The reviewer's forms: a rejection needs a reason, which reaches the model."""

from __future__ import annotations

from django import forms

REASON_MAX_LENGTH = 500


class RejectForm(forms.Form):
    reason = forms.CharField(
        max_length=REASON_MAX_LENGTH,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 2}),
        error_messages={"required": "Say why: the reason is sent to the agent's model."},
    )
