"""The service's FastAPI app, with its busiest route answered past Starlette's router.

Synopsis:

    app = ServiceApp(title=...)           # a FastAPI app in every other way
    app.include_router(sampling.router)   # routes, middleware and handlers added as usual
    app.answer_directly(SAMPLE_ROUTE)     # GET /sample: the same handler, fewer layers

Why: at concurrency 64 on two cores one worker's event loop is the service's limit, and a
request for `/sample` passed through the router's matching of every included router and
FastAPI's per-request wrapper (two exit stacks, a send wrapper) before its handler ran.
Answered directly, a request runs the same stack Starlette builds, in the same order, with the
router's part cut out: the error middleware (the app's 500 handler), the app's own middleware
(metrics, request ids), Starlette's exception handling with the app's handlers (422, 503 as
before), then the route's handler. Every other method and path, and any app served under a
root path, with a body limit or with FastAPI's telemetry on, go through the whole stack; the
route stays registered there, so it is documented and matched as before.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette._exception_handler import wrap_app_handling_exceptions
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import Request
from starlette.routing import NoMatchFound

SERVER_ERRORS = (500, Exception)  # Starlette gives a handler of these to its error middleware


class ServiceApp(FastAPI):
    """FastAPI, with the routes of `answer_directly` answered past the router (see the module
    docstring)."""

    def __init__(self, **options):
        super().__init__(**options)
        self._direct_routes: list[APIRoute] = []
        self._direct_apps: dict[str, object] = {}  # by path, built with the middleware stack

    def answer_directly(self, route: APIRoute) -> None:
        """Answer a GET of `route.path` past the router. Only for a route whose handler needs
        none of FastAPI's per-request exit stacks (no dependency that yields), like
        `SampleRoute`, included with no prefix or dependencies of the include's own."""
        self._direct_routes.append(route)

    def build_middleware_stack(self):
        """The whole stack, as FastAPI builds it; beside it the direct answers, for routes the
        app's router reaches at their own path."""
        stack = super().build_middleware_stack()
        plain = self.max_body_size is None and not self._native_telemetry.enabled()
        self._direct_apps = {route.path: self._direct_app(route)
                             for route in self._direct_routes if plain and self._reaches(route)}
        return stack

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not self.root_path:
            if self.middleware_stack is None:
                self.middleware_stack = self.build_middleware_stack()
            direct = self._direct_apps.get(scope["path"])
            if direct is not None:
                scope["app"] = self
                return await direct(scope, receive, send)
        await super().__call__(scope, receive, send)

    def _reaches(self, route: APIRoute) -> bool:
        try:
            return str(self.url_path_for(route.name)) == route.path
        except NoMatchFound:  # never included
            return False

    def _direct_app(self, route: APIRoute):
        """The route's handler inside the stack Starlette builds, less the router."""
        handler = route.get_route_handler()
        on_error, by_status, by_class = None, {}, {}  # split as Starlette splits them
        for key, value in self.exception_handlers.items():
            if key in SERVER_ERRORS:
                on_error = value  # the last one registered, as Starlette picks it
            elif isinstance(key, int):
                by_status[key] = value
            else:
                by_class[key] = value

        async def endpoint(scope, receive, send) -> None:
            scope["route"] = route
            scope["starlette.exception_handlers"] = (by_class, by_status)
            request = Request(scope, receive, send)

            async def respond(scope, receive, send) -> None:
                response = await handler(request)
                await response(scope, receive, send)

            await wrap_app_handling_exceptions(respond, request)(scope, receive, send)

        app = endpoint
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return ServerErrorMiddleware(app, handler=on_error, debug=self.debug)
