from django.urls import URLPattern, URLResolver

app_name = "dispatch"

urlpatterns: list[URLPattern | URLResolver] = []
