"""The web console: static files shipped in this package, served at ``/``.

    app = Starlette(routes=routes())     # acp_server.app.build_app, unless --no-web
    # GET /             -> static/index.html
    # GET /web/app.js   -> static/app.js (one flat folder, names fixed at import)

Contracts:

* Only the files present in ``static/`` when the module is imported are served, by
  exact name (no sub-folders, no path parameters, so no traversal); anything else
  under ``/web/`` is 404.
* The files are public (``PUBLIC_PATHS``: the network guard lets ``GET``/``HEAD``
  through without the token); they hold no data. Everything the page shows comes
  from the API with the bearer token the page asks for.
* Each answer carries a Content Security Policy allowing only this origin's scripts,
  styles and fetches (no inline script, nothing from the network), ``nosniff``,
  ``no-referrer`` and ``frame-ancestors 'none'``.
* ``VENDORED`` files are third-party libraries shipped byte for byte as their npm
  package publishes them (no build step), pinned by version and SHA-256, with their
  licence files beside them in ``static/`` (shipped in the package, not served). To
  move one: ``npm pack NAME@VERSION``, copy the file and its licence, update the row.
"""

from __future__ import annotations

import os
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

PREFIX = "/web/"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# served name -> (npm package, version, licence, licence file(s) in static/, SHA-256)
VENDORED = {
    "marked.esm.js": ("marked", "18.2.1", "MIT", ("marked.LICENSE.md",),
                      "5371fea86fd0656b4fc7bea7c94c663109d82789b69433eeee78d42895aa44de"),
    "purify.es.js": ("dompurify", "3.4.18", "MPL-2.0 OR Apache-2.0",
                     ("purify.LICENSE.txt", "purify.LICENSE-MPL.txt"),
                     "1a06b721ad8b46d6174b21f22ea70290aaf3e5a81d65af3b7178113953f7c9b1"),
}
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def _load() -> dict[str, tuple[bytes, str]]:
    folder = resources.files(__package__).joinpath("static")
    files: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        content_type = CONTENT_TYPES.get(os.path.splitext(entry.name)[1])
        if entry.is_file() and content_type is not None:
            files[entry.name] = (entry.read_bytes(), content_type)
    return files


FILES = _load()


def public_path(method: str, path: str) -> bool:
    """Whether the network guard serves this request without the token."""
    return method in ("GET", "HEAD") and (path == "/" or path.startswith(PREFIX))


def _file(name: str) -> Response:
    found = FILES.get(name)
    if found is None:
        return Response(b'{"error":"Not Found"}', 404, media_type="application/json")
    body, content_type = found
    return Response(body, 200, HEADERS, content_type)


async def index(request: Request) -> Response:
    return _file("index.html")


async def static(request: Request) -> Response:
    return _file(request.path_params["name"])


def routes() -> list[BaseRoute]:
    return [Route("/", index, methods=["GET", "HEAD"]),
            Route(PREFIX + "{name}", static, methods=["GET", "HEAD"])]
