"""The HTTP front door: OpenAI-compatible speech, a streaming WebSocket and a playground page,
served by uvicorn in the gRPC server's event loop, over the same synthesis path (api/synthesis.py)."""
