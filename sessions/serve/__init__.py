"""The serving loop (session 7): many users at once. The engine's slots and pages and its
scheduler (vLLM's LLMEngine face: add_request, step, abort_request), and the HTTP server
that puts it behind OpenAI's API (server.py, over the engine's one thread, orchestrator.py)."""
