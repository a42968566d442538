"""How the API's routes document their errors, and how an OpenAI route registers at two paths.

OpenAI's clients put `/v1` in their base_url, but some users leave it out: each OpenAI POST route
answers at `/v1/PATH` (in the OpenAPI schema) and at `/PATH` (hidden from it).
"""

from __future__ import annotations

from fastapi import APIRouter

from onebit.api.protocol import ErrorResponse

# The error statuses a route may answer with, all with the OpenAI-shaped body (`onebit.api.errors`).
ERROR_RESPONSES = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 500, 503)}
# A route that answers JSON, or an SSE stream when asked: its 200 documents both media types.
STREAMING_RESPONSES = {200: {"content": {"text/event-stream": {}}}, **ERROR_RESPONSES}


def post_v1_and_bare(router: APIRouter, path: str, response_model=None, streams: bool = False):
    """A decorator that registers the endpoint on `router` for POST at `/v1{path}` (documented with
    ERROR_RESPONSES, and its 200 body as `response_model` when given; with `streams` the 200 also
    as an SSE stream) and at `path` without `/v1` (undocumented)."""
    responses: dict = {}
    if response_model is not None:
        responses[200] = {"model": response_model}
    if streams:
        responses.setdefault(200, {})["content"] = {"text/event-stream": {}}
    responses.update(ERROR_RESPONSES)

    def register(endpoint):
        router.post(path, response_model=None, include_in_schema=False)(endpoint)
        return router.post(f"/v1{path}", response_model=None, responses=responses)(endpoint)

    return register
