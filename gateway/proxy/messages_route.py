"""Anthropic Messages through the gateway: the prompt vLLM renders, errors in Anthropic's shape."""

from __future__ import annotations

from gateway.errors import GatewayError
from vllm_api import anthropic

# One definition, shared with the simulator: the chat vLLM renders a Messages body as.
chat_messages = anthropic.chat_messages


def error_body(err: GatewayError) -> bytes:
    """The gateway's own error as vLLM's Messages handler shapes one."""
    return anthropic.error_body(err.error_type, err.message)
