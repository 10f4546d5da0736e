from django.urls import path

from approvals import analytics, what_if

app_name = "analytics"

urlpatterns = [
    path("", analytics.dashboard, name="dashboard"),
    path("export.csv", analytics.export_csv, name="export"),
    path("what-if/", what_if.what_if, name="what-if"),
    path("calls/", analytics.calls, name="calls"),
    path("calls/<slug:call_id>/", analytics.call_detail, name="call"),
    path(
        "sessions/<int:agent_id>/<str:session_id>/",
        analytics.session_timeline,
        name="session",
    ),
]
