"""The HTTP front end: the raw-ASGI hot path, the Starlette routes, the uvicorn server."""
