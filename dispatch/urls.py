from django.urls import path, re_path

from dispatch import apis

app_name = "dispatch"

urlpatterns = [
    path("calls", apis.CallCreateApi.as_view(), name="calls"),
    path("tools", apis.ToolListApi.as_view(), name="tools"),
    path("codes", apis.CodeListApi.as_view(), name="codes"),
    path(
        "sessions/<str:session_id>/calls",
        apis.SessionCallsApi.as_view(),
        name="session-calls",
    ),
    path(
        "confirmations/<str:confirmation_id>",
        apis.ConfirmationDetailApi.as_view(),
        name="confirmation",
    ),
    path(
        "confirmations/<str:confirmation_id>/withdraw",
        apis.ConfirmationWithdrawApi.as_view(),
        name="confirmation-withdraw",
    ),
    # Last: any other path under the prefix is a 404 in the envelope, in DEBUG too.
    re_path(r"", apis.NotFoundApi.as_view(), name="not-found"),
]
