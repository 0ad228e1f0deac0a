"""An OpenAI-compatible HTTP server over any engine with the step API (add_request / step / abort_request).

    protocol.py     request bodies, their SamplingParams, errors in OpenAI's shape
    stops.py        stop strings on the detokenised text, held back across token boundaries
    engine_loop.py  the one thread that owns the engine and drives step(); handlers talk to it by messages
    app.py          the FastAPI routes: /v1/completions, /v1/chat/completions (streaming or not), /v1/models,
                    /health
    __main__.py     python -m common.serve --stage 05 [--model DIR|PRESET] [--host] [--port]
"""
