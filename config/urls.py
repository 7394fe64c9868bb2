from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from api import views as api_views
from api.auth import throttled_bearer
from api.links import approval_link_view
from api.main import not_found as api_not_found
from api.main import urls as api_urls
from durable.observability.metrics_view import metrics_view

admin.autodiscover()  # the apps' admin.py: here, not at start-up (SimpleAdminConfig)
admin.site.site_header = "Durable administration"
admin.site.site_title = "Durable admin"
admin.site.index_title = "Tools, schedules, runs and access"

urlpatterns = [
    # browsers ask for /favicon.ico whatever the page's <link rel="icon"> says
    path("favicon.ico", RedirectView.as_view(url=static("dashboard/favicon.svg"), permanent=True)),
    path("admin/", admin.site.urls),
    # Prometheus (durable/observability/metrics.py): a bearer token or a logged-in viewer;
    # a wrong token counts as a failed authentication, as the API's tokens do
    path("metrics", throttled_bearer(metrics_view), name="metrics"),
    path("accounts/", include("django.contrib.auth.urls")),
    # the JSON API: api/main.py (schema at /api/v1/schema, docs at /api/v1/docs)
    path("api/v1/", api_urls()),
    path("api/v1/<path:rest>", api_not_found),
    # approve or reject from a signed link (api/links.py): a confirmation page, then a POST
    path("approvals/link/<str:token>/", approval_link_view, name="approval_link"),
    # the API's pages: the user's tokens and the outgoing webhooks' delivery log
    path("api-tokens/", api_views.tokens_page, name="api_tokens"),
    path("api-tokens/<int:token_id>/revoke/", api_views.token_revoke_view, name="api_token_revoke"),
    path("webhooks/", api_views.deliveries_page, name="webhook_deliveries"),
    path("", include("dashboard.urls")),
]

handler400 = "dashboard.views.bad_request"
handler500 = "dashboard.views.server_error"
