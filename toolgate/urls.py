from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

from analytics import urls as analytics_urls
from analytics.apis import MetricsApi, PolicyWhatIfApi
from approvals import apis as approvals_apis
from toolgate import views

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/", admin.site.urls),
    # Before Django's own: after logging in, each role lands on its page.
    path("accounts/login/", views.RoleLoginView.as_view(), name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    # After Django's: the login and logout stay Toolgate's; allauth serves the second factor's
    # pages (/accounts/2fa/) and the re-authentication they ask for.
    path("accounts/", include("allauth.urls")),
    path("approvals/", include("approvals.urls")),
    path("analytics/", include("analytics.urls")),
    path(
        "policy-changes/",
        include((analytics_urls.decision_urlpatterns, "policy-changes")),
    ),
    path("records/", include("records.urls")),
    path("books/", include("books.urls")),
    # Browsers ask for it whatever the page says; the layout's icon answers.
    path("favicon.ico", views.favicon, name="favicon"),
    path(
        "api/schema/",
        SpectacularAPIView.as_view(permission_classes=[AllowAny]),
        name="schema",
    ),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(url_name="schema", permission_classes=[AllowAny]),
        name="swagger-ui",
    ),
    # Before dispatch's, whose last pattern answers every other path under the prefix with a 404.
    path(
        "api/v1/confirmations/<str:confirmation_id>/approve",
        approvals_apis.ConfirmationApproveApi.as_view(),
        name="confirmation-approve",
    ),
    path(
        "api/v1/confirmations/<str:confirmation_id>/reject",
        approvals_apis.ConfirmationRejectApi.as_view(),
        name="confirmation-reject",
    ),
    path("api/v1/metrics", MetricsApi.as_view(), name="metrics"),
    path("api/v1/metrics/what-if", PolicyWhatIfApi.as_view(), name="metrics-what-if"),
    path("api/v1/", include("dispatch.urls")),
]

# Under /api/v1/ failures answer in the API's JSON envelope; elsewhere, Django's pages.
handler400 = "dispatch.errors.bad_request"
handler500 = "dispatch.errors.server_error"
