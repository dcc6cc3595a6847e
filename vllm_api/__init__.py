"""vLLM's wire formats, one definition each: error bodies, SSE, /metrics, KV events, tokens, chat.

Pure (no I/O): the gateway reads replicas with it and the simulator writes like vLLM with it.
"""
