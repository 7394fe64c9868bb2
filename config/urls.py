from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from durable.metrics_view import metrics_view

urlpatterns = [
    # browsers ask for /favicon.ico whatever the page's <link rel="icon"> says
    path("favicon.ico", RedirectView.as_view(url=static("dashboard/favicon.svg"), permanent=True)),
    path("admin/", admin.site.urls),
    # Prometheus (durable/metrics.py): a bearer token or a logged-in viewer
    path("metrics", metrics_view, name="metrics"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("dashboard.urls")),
]

handler400 = "dashboard.views.bad_request"
