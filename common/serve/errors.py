"""Every error the server answers keeps OpenAI's shape, {"error": {"message", "type", "param", "code"}}: the
server's own (OpenAIError), a body FastAPI could not parse or validate, the framework's 404 and 405, and an
exception nobody caught (a 500). A client library reads `error.message` whatever went wrong."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .engine_loop import ShuttingDown
from .protocol import OpenAIError

UNPARSABLE = "There was an error parsing the body"      # FastAPI's words for a body it could not decode


def answer(e: OpenAIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers={"Retry-After": "1"} if e.status == 503 else None)


def validation_error(e: RequestValidationError) -> OpenAIError:
    """pydantic's first complaint, in words that name the field as the client sent it."""
    first = e.errors()[0]
    kind, loc = first.get("type"), [str(x) for x in first.get("loc", ()) if x != "body"]
    where = ".".join(loc)
    if kind == "json_invalid":
        return OpenAIError(400, f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'unparsable')})")
    if not loc:                       # the body as a whole: empty, or JSON that is not an object
        return OpenAIError(400, "the body must be a JSON object" + (" (it is empty)" if kind == "missing" else ""))
    if kind == "extra_forbidden":     # OpenAI's own answer to a field it does not know
        return OpenAIError(400, f"Unrecognized request argument supplied: {where}", where)
    return OpenAIError(400, f"{where}: {first.get('msg')}", where)


def install(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(_, e: OpenAIError):
        return answer(e)

    @app.exception_handler(ShuttingDown)
    async def shutting_down(_, e: ShuttingDown):
        return answer(OpenAIError(503, str(e)))

    @app.exception_handler(RequestValidationError)
    async def bad_body(_, e: RequestValidationError):
        return answer(validation_error(e))

    @app.exception_handler(HTTPException)
    async def framework(request: Request, e: HTTPException):
        if e.status_code == 404:
            message = f"{request.method} {request.url.path}: no such route"
        elif e.status_code == 405:
            message = (f"{request.method} is not allowed on {request.url.path} "
                       f"(allowed: {(e.headers or {}).get('Allow', '?')})")
        elif e.detail == UNPARSABLE:
            message = "the body is not valid JSON text (JSON is UTF-8)"
        else:
            message = str(e.detail)
        return JSONResponse(OpenAIError(e.status_code, message).body(), status_code=e.status_code,
                            headers=e.headers)

    @app.exception_handler(Exception)
    async def uncaught(_, e: Exception):
        return answer(OpenAIError(500, f"the server failed this request: {type(e).__name__}: {e}"))
