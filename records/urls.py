from django.urls import path

from records import views

app_name = "records"

urlpatterns = [
    path("confirmations/", views.confirmations, name="confirmations"),
    path("confirmations/<slug:confirmation_id>/", views.confirmation, name="confirmation"),
    path("security/", views.security_events, name="security"),
    path("orders/", views.orders, name="orders"),
    path("orders/<str:order_id>/", views.order, name="order"),
]
