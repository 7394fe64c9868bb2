"""ASGI entry point, served by daphne: HTTP through Django, websockets through Channels.

Request bodies over ``MAX_REQUEST_BODY_BYTES`` are answered 413 before Django reads
them (:mod:`dashboard.bodylimit`). With the ``mcp`` extra, ``/mcp`` is the MCP endpoint
(:mod:`durable.contrib.mcp.http`, API tokens with the scope ``mcp:call``). Websockets
(the dashboard's live updates) go through the session authentication of
``AuthMiddlewareStack`` and accept only origins in ``ALLOWED_HOSTS``.
"""

import importlib.util
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DURABLE_PROCESS", "web")  # config/settings.py: the web's connections

# Django's ASGI handler with the middleware run in one thread hop (config/asgi_handler.py)
from config.asgi_handler import get_asgi_application

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator

from dashboard.bodylimit import BodySizeLimitMiddleware
from dashboard.routing import websocket_urlpatterns

http_app = BodySizeLimitMiddleware(django_asgi_app)
if importlib.util.find_spec("mcp") is not None:
    # the MCP endpoint at /mcp (durable[mcp], docs/mcp.md), behind API tokens
    from durable.contrib.mcp.http import with_mcp

    http_app = BodySizeLimitMiddleware(with_mcp(django_asgi_app))

application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
