from django.urls import path

from analytics import policy_changes, views, what_if

app_name = "analytics"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("export.csv", views.export_csv, name="export"),
    path("what-if/", what_if.what_if, name="what-if"),
    path("policy-changes/", policy_changes.policy_changes, name="policy-changes"),
    path("policy-changes/<int:change_id>/", policy_changes.policy_change, name="policy-change"),
    path("calls/", views.calls, name="calls"),
    path("calls/<slug:call_id>/", views.call_detail, name="call"),
    path(
        "sessions/<int:agent_id>/<str:session_id>/",
        views.session_timeline,
        name="session",
    ),
]

# What managers write: a policy change drafted, approved or withdrawn. Not under /analytics/,
# whose requests only read (analytics/heavy.py rolls back what they did).
decision_urlpatterns = [
    path("propose/", policy_changes.policy_change_propose, name="propose"),
    path("limits/", policy_changes.limit_change_propose, name="limit"),
    path(
        "<int:change_id>/approve/",
        policy_changes.policy_change_approve_view,
        name="approve",
    ),
    path(
        "<int:change_id>/withdraw/",
        policy_changes.policy_change_withdraw_view,
        name="withdraw",
    ),
]
