from django.urls import path

from analytics import views, what_if

app_name = "analytics"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("export.csv", views.export_csv, name="export"),
    path("what-if/", what_if.what_if, name="what-if"),
    path("calls/", views.calls, name="calls"),
    path("calls/<slug:call_id>/", views.call_detail, name="call"),
    path(
        "sessions/<int:agent_id>/<str:session_id>/",
        views.session_timeline,
        name="session",
    ),
]
