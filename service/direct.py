"""The service's FastAPI app, with its busiest route answered past Starlette's router.

Synopsis:

    app = ServiceApp(title=...)           # a FastAPI app in every other way
    app.include_router(sampling.router)   # routes, middleware and handlers added as usual
    app.answer_directly(SAMPLE_ROUTE)     # GET /sample: the same handler, fewer layers

Why: at concurrency 64 on two cores one worker's event loop is the service's limit, and a
request for `/sample` passed through Starlette's error middleware, its exception middleware, the
router's matching of every included router, and FastAPI's per-request wrapper (two exit stacks
and a send wrapper) before its handler ran. Answered directly, a request runs the app's own
middleware (`user_middleware`: metrics, request ids), Starlette's own exception handling with
the app's handlers (`wrap_app_handling_exceptions`: 422, 503 as before), then the route's
handler. Every other method and path, and any app served under a root path, go through the
whole stack as before; the route stays registered there, so it is documented and matched as
before.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette._exception_handler import wrap_app_handling_exceptions
from starlette.requests import Request


# Starlette hands a handler of these to its error middleware, which the direct answer skips:
# an app that registers one is answered through the whole stack.
SERVER_ERRORS = {500, Exception}


class ServiceApp(FastAPI):
    """FastAPI, with the routes of `answer_directly` answered past the router (see the module
    docstring)."""

    def __init__(self, **options):
        super().__init__(**options)
        self._direct_routes: dict[str, APIRoute] = {}
        self._direct_apps: dict[str, object] | None = None  # built at the first request

    def answer_directly(self, route: APIRoute) -> None:
        """Answer GET `route.path` past the router. Only for a route whose handler needs none of
        FastAPI's per-request exit stacks (no dependency that yields), like `SampleRoute`."""
        self._direct_routes[route.path] = route
        self._direct_apps = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not self.root_path:
            if self._direct_apps is None:
                self._direct_apps = {} if SERVER_ERRORS & set(self.exception_handlers) else {
                    path: self._direct_app(route) for path, route in self._direct_routes.items()}
            direct = self._direct_apps.get(scope["path"])
            if direct is not None:
                scope["app"], scope["route"] = self, self._direct_routes[scope["path"]]
                return await direct(scope, receive, send)
        await super().__call__(scope, receive, send)

    def _direct_app(self, route: APIRoute):
        """The route's handler behind the app's exception handlers and its own middleware, in
        the order Starlette stacks them (the first added innermost)."""
        handler = route.get_route_handler()
        by_status = {key: value for key, value in self.exception_handlers.items()
                     if isinstance(key, int)}
        by_class = {key: value for key, value in self.exception_handlers.items()
                    if not isinstance(key, int)}

        async def endpoint(scope, receive, send) -> None:
            scope["starlette.exception_handlers"] = (by_class, by_status)
            request = Request(scope, receive, send)

            async def respond(scope, receive, send) -> None:
                response = await handler(request)
                await response(scope, receive, send)

            await wrap_app_handling_exceptions(respond, request)(scope, receive, send)

        app = endpoint
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return app
