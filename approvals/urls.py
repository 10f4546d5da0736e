from django.urls import path

from approvals import views

app_name = "approvals"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("history/", views.history, name="history"),
    path("reconciliation/", views.reconciliation, name="reconciliation"),
    path("factor/", views.factor, name="factor"),
    path("<slug:confirmation_id>/", views.detail, name="detail"),
    path("<slug:confirmation_id>/approve", views.approve, name="approve"),
    path("<slug:confirmation_id>/reject", views.reject, name="reject"),
    path("<slug:confirmation_id>/reconcile", views.reconcile, name="reconcile"),
]
