"""The HTTP front end (FastAPI): OpenAI's completions and chat completions over the engine loop, streaming or not.

A request's life: the body is parsed and checked (a 400 in OpenAI's shape otherwise: errors.py), the prompt is
encoded (the chat template for messages) on a thread of the tokenizer's pool, not on the event loop, so that a
huge prompt does not stall every other stream while it is encoded; its max_tokens must fit beside it in
max_model_len; the loop queues it (the engine's own validation is a 400 too), and its Deltas come back one step at
a time. A stream sends each as a server-sent event. A client that goes away, streamed or not, is aborted, so its
slot is free by the next step.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from common.prompts import PromptError

from . import errors
from .engine_loop import Delta, EngineFailed, EngineLoop, NoPrefixCache, ShuttingDown
from .protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from .stops import StopMatcher

TOKENIZER_THREADS = 2    # a huge prompt being encoded does not hold up the next small one


async def until_disconnected(request: Request, handler):
    """Run the handler's coroutine, and cancel it if its client goes away first (vLLM's with_cancellation): the
    cancellation reaches the handler where it waits (for the engine's next tokens), and its finally aborts the
    engine's request. A stream is watched the same way by StreamingResponse once the handler has returned it."""
    work = asyncio.ensure_future(handler)
    gone = asyncio.ensure_future(_disconnect(request))
    await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
    if work.done():
        gone.cancel()
        return work.result()
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)       # its abort is sent before this returns
    return Response(status_code=499)                         # nginx's "client closed request": nobody reads it


async def _disconnect(request: Request) -> None:
    """Returns when the ASGI server says the client has gone (the body was read before the handler ran, so the
    only message left to receive is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def encode_text(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """tokenizer.encode(text), which lets go of the interpreter lock while it works (common/tokenizer.py): a
    function of its own so that a test can stand in a slow one."""
    return tokenizer.encode(text, add_special_tokens)


def build_app(loop: EngineLoop, model_name: str, max_waiting: int = 1024) -> FastAPI:
    """The routes over a started EngineLoop. Beyond max_waiting requests queued for a seq_slot, a new one gets
    503 with Retry-After (back-pressure: the queue would only grow, and every TTFT with it)."""
    pool = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="tokenize")

    @contextlib.asynccontextmanager
    async def lifespan(_):
        yield
        pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="tiny-vllm", lifespan=lifespan)
    errors.install(app)
    prompts = loop.engine.prompts
    tokenizer = prompts.tokenizer
    created = int(time.time())

    @app.get("/health")
    async def health():
        if loop.dead:                    # 503, as vLLM's /health once its engine is dead
            return JSONResponse({"status": "dead", "reason": loop.dead}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(loop.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        """vLLM's route: the engine forgets every cached block, so that a benchmark's next run starts cold. A 400
        over an engine without a prefix cache, a 409 while requests run (the engine's own words)."""
        try:
            await loop.reset_prefix_cache()
        except (NoPrefixCache, RuntimeError) as e:
            if loop.dead:
                raise OpenAIError(503, f"the engine is not running: {loop.dead}") from None
            raise OpenAIError(400 if isinstance(e, NoPrefixCache) else 409, str(e)) from None
        return Response(status_code=200)                       # vLLM's answer: no body

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "tiny-vllm", "max_model_len": loop.engine.max_model_len}]}

    def admit(req) -> None:
        if req.model is not None and req.model != model_name:
            raise OpenAIError(404, f"model {req.model!r} does not exist; this server serves {model_name!r}", "model")
        if loop.num_waiting >= max_waiting:
            raise OpenAIError(503, f"{loop.num_waiting} requests are waiting (--max-waiting {max_waiting}); "
                              "retry later")

    def encode(req, chat: bool) -> list[int]:
        """The prompt's token ids, checked against the vocabulary and max_model_len (the message names both
        numbers). Runs on the tokenizer's pool."""
        try:
            if not chat:
                text = req.prompt
                return prompts.encode(encode_text(tokenizer, text, True) if isinstance(text, str) else text)
            template = tokenizer.chat_prompt(req.template_messages())
            return prompts.encode(encode_text(tokenizer, template, False))      # the template holds its BOS
        except PromptError as e:
            raise OpenAIError(400, str(e), "messages" if chat else "prompt") from None

    async def serve(req, chat: bool):
        admit(req)
        req.refuse_unsupported()
        stops = req.stop_strings()
        ids = await asyncio.get_running_loop().run_in_executor(pool, encode, req, chat)
        params = req.params(len(ids), loop.engine.max_model_len, "messages" if chat else "prompt")
        rid, sink = await submit(ids, params)
        return await respond(req, rid, sink, stops, ids, chat)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        return await until_disconnected(request, serve(req, chat=False))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        return await until_disconnected(request, serve(req, chat=True))

    async def submit(ids, params):
        """Queue a request with the engine loop; what the engine refuses is a 400, a dead engine a 503."""
        try:
            return await loop.add(ids, params)
        except PromptError as e:
            raise OpenAIError(400, str(e)) from None
        except ShuttingDown:
            raise
        except Exception as e:  # noqa: BLE001
            if loop.dead:
                raise OpenAIError(503, f"the engine is not running: {loop.dead}") from None
            raise OpenAIError(500, f"the engine refused the request: {type(e).__name__}: {e}") from None

    async def deltas(rid, sink, stops):
        """(text, finish_reason, completion tokens, new token ids, prompt tokens found in the prefix cache) per
        step (or per several, merged, when this handler fell behind), stop strings applied; the engine's request
        is aborted when a stop string ends it early or the consumer goes away."""
        matcher, engine_done, detok, ids = StopMatcher(stops), False, tokenizer.stream(), []
        try:
            while True:
                d = await sink.get()
                if isinstance(d, EngineFailed):
                    raise d
                d, failed = merge_waiting(d, sink)
                ids += d.token_ids
                text = "".join(detok.step(t) for t in d.token_ids)
                if d.finish_reason is not None:    # the last piece flushes what the stream held back
                    text += detok.finish(ids)
                text = matcher.feed(text)
                if matcher.stopped:                # the engine's request runs on: the finally aborts it
                    yield text, "stop", d.num_tokens, d.token_ids, d.num_cached_tokens
                    return
                if d.finish_reason is not None:
                    engine_done = True
                    yield (text + matcher.flush(), "stop" if d.finish_reason == "stop" else "length", d.num_tokens,
                           d.token_ids, d.num_cached_tokens)
                    return
                yield text, None, d.num_tokens, d.token_ids, d.num_cached_tokens
                if failed is not None:
                    raise failed
        finally:
            if not engine_done:
                loop.abort(rid)

    def merge_waiting(d: Delta, sink) -> tuple[Delta, EngineFailed | None]:
        """d and every Delta already waiting behind it, as one (and an EngineFailed that came after them): a
        handler that fell behind the engine sends one event for several steps, not one each, and so catches up
        (vLLM's output processor merges a request's waiting outputs the same way)."""
        while d.finish_reason is None and not sink.empty():
            nxt = sink.get_nowait()
            if isinstance(nxt, EngineFailed):
                return d, nxt
            d = Delta(d.token_ids + nxt.token_ids, nxt.num_tokens, nxt.finish_reason,
                      max(d.num_cached_tokens, nxt.num_cached_tokens))
        return d, None

    async def respond(req, rid, sink, stops, prompt_ids: list[int], chat: bool):
        kind = "chat.completion" if chat else "text_completion"
        oid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"

        prompt_tokens, created = len(prompt_ids), int(time.time())      # every chunk says the same time (OpenAI)

        def usage(n, cached):
            return {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n,
                    "prompt_tokens_details": {"cached_tokens": cached}}                    # OpenAI's shape

        def body(obj, choices, **extra):
            return {"id": oid, "object": obj, "created": created, "model": model_name, "choices": choices, **extra}

        def choice(text, reason, stream, ids=None):
            if not chat:
                c = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
            else:
                part = text if isinstance(text, dict) else {"role": "assistant", "content": text}
                c = {"index": 0, ("delta" if stream else "message"): part, "finish_reason": reason}
            return c | ({"token_ids": ids} if req.return_token_ids and ids is not None else {})

        ids_extra = {"prompt_token_ids": prompt_ids} if req.return_token_ids else {}

        if not req.stream:
            text, reason, n, ids, cached = "", None, 0, [], 0
            try:
                async for piece, reason, n, new, found in deltas(rid, sink, stops):
                    text += piece
                    ids += new
                    cached = max(cached, found)
            except EngineFailed as e:
                raise OpenAIError(500, f"the engine failed this request: {e}") from None
            except Exception as e:  # noqa: BLE001  this request's own processing broke: it alone fails
                raise OpenAIError(500, f"the server failed this request: {type(e).__name__}: {e}") from None
            return body(kind, [choice(text, reason, False, ids)], usage=usage(n, cached), **ids_extra)

        chunk = f"{kind}.chunk" if chat else kind

        def event(obj) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        async def sse():
            n, cached, first = 0, 0, ids_extra    # the prompt's ids (return_token_ids) go in the first chunk only
            if chat:                      # OpenAI's first chunk names the role
                yield event(body(chunk, [choice({"role": "assistant", "content": ""}, None, True)], **first))
                first = {}
            try:
                async for piece, reason, n, new, found in deltas(rid, sink, stops):
                    cached = max(cached, found)
                    if piece or reason or req.return_token_ids:
                        yield event(body(chunk, [choice({"content": piece} if chat else piece, reason, True, new)],
                                         **first))
                        first = {}
            except EngineFailed as e:
                yield event(OpenAIError(500, f"the engine failed this request: {e}").body())
            except Exception as e:  # noqa: BLE001  this request's own processing broke: it alone fails
                yield event(OpenAIError(500, f"the server failed this request: {type(e).__name__}: {e}").body())
            if req.stream_options and req.stream_options.include_usage:
                yield event(body(chunk, [], usage=usage(n, cached)))
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    return app
