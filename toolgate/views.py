from __future__ import annotations

from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from toolgate.navigation import landing_url, places_for


def home(request: HttpRequest) -> HttpResponse:
    """The product in a sentence, and the places of the signed-in user."""
    return render(request, "home.html", {"my_places": places_for(request.user)})


@require_GET
@cache_control(max_age=86400, public=True)
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever a page links to (the admin's pages link none): the
    layout's icon answers."""
    return redirect(static("toolgate/favicon.svg"))


class RoleLoginView(LoginView):
    """Django's login; without a `next`, each role lands on its own page (navigation.py). After a
    failure it says how many attempts are left before the lockout: counted for the user name
    and the address as axes counts them, the same whether the user exists or not."""

    def get_default_redirect_url(self) -> str:
        return landing_url(self.request.user)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context_data(**kwargs)
        # Single sign-on, where a provider is configured (docs/identity.md).
        if settings.TOOLGATE_OIDC_SERVER_URL:
            context["sso_name"] = settings.TOOLGATE_OIDC_NAME
        # Password logins off: the form stays, for the local administrators listed.
        context["passwords_restricted"] = not settings.TOOLGATE_PASSWORD_LOGIN
        return context

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        username = str(self.request.POST.get("username", ""))
        failures = AxesProxyHandler.get_failures(self.request, {"username": username})
        left = max(0, settings.AXES_FAILURE_LIMIT - failures)
        return self.render_to_response(self.get_context_data(form=form, attempts_left=left))


def login_locked_out(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """What axes answers, on the site's login and the admin's, once a user name and address are
    locked out: a page in the site's layout that says how long to wait."""
    cool_off_seconds = int(settings.AXES_COOLOFF_TIME.total_seconds())
    response = render(
        request,
        "registration/locked_out.html",
        {
            "failure_limit": settings.AXES_FAILURE_LIMIT,
            "cool_off_minutes": max(1, round(cool_off_seconds / 60)),
        },
        status=429,
    )
    # Every attempt during the lockout starts the cool-off again (axes' default).
    response["Retry-After"] = str(cool_off_seconds)
    return response
