from django.urls import path

from approvals import channel_views, views

app_name = "approvals"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("list/", views.triage, name="triage"),
    path("history/", views.history, name="history"),
    path("reconciliation/", views.reconciliation, name="reconciliation"),
    path("reconciliation/<slug:key>/settle", views.settle_outcome, name="settle_outcome"),
    path("mail/<str:token>/", channel_views.mail_link, name="mail_link"),
    path("slack/actions", channel_views.slack_actions, name="slack_actions"),
    path("slack/commands", channel_views.slack_commands, name="slack_commands"),
    path("slack/link", channel_views.slack_link, name="slack_link"),
    path("factor/", views.factor, name="factor"),
    path("<slug:confirmation_id>/", views.detail, name="detail"),
    path("<slug:confirmation_id>/approve", views.approve, name="approve"),
    path("<slug:confirmation_id>/edit", views.edit, name="edit"),
    path("<slug:confirmation_id>/reject", views.reject, name="reject"),
    path("<slug:confirmation_id>/reconcile", views.reconcile, name="reconcile"),
]
