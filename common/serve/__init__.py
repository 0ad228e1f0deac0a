"""An OpenAI-compatible HTTP server over any engine with the step API (add_request / step / abort_request).

    __main__.py       python -m common.serve [--stage NN] [--model DIR|PRESET] [--port] ...: flags checked, one
                      line and exit 2 for a bad one
    engines.py        which engine it serves: the stage's Engine on a GPU, its CpuEngine without one
    engine_process.py the engine in a process of its own (vLLM's engine core), stepping on its own
    engine_loop.py    the one thread that owns the engine (or its process's proxy) and drives step(); handlers
                      talk to it by messages
    app.py            the FastAPI routes: /v1/completions, /v1/chat/completions (streaming or not), /v1/models,
                      /health, /metrics; prompts encoded off the event loop; a client that leaves is aborted;
                      POST /reset_prefix_cache (vLLM's) empties a prefix cache between two steps
    protocol.py       request bodies, the fields accepted, refused or ignored, their SamplingParams
    errors.py         every error in OpenAI's shape, the framework's own included
    stops.py          stop strings on the detokenised text, held back across token boundaries
    metrics.py        the Prometheus metrics, named as vLLM's
    server.py         uvicorn, told to stop the engine loop first on Ctrl-C
    client.py         the load generator's streaming client (common.bench_serving)
"""
