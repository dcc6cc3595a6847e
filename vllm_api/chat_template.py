"""Chat templates rendered exactly as the replica renders them (Jinja2, sandboxed)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

from vllm_api.errors import VllmApiError

# ChatML-like default, used when no tokenizer_config.json provides a template.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(VllmApiError):
    """Root error of the chat template module (bad config, template that fails to render)."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _content_text(content: Any) -> Any:
    # OpenAI allows content as a list of parts; templates written for strings get the text
    # parts, one per line, as vLLM joins them.
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return "" if content is None else content


def _chatml(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str | None:
    """DEFAULT_TEMPLATE's output without Jinja2; None when a role or content is not a str."""
    # Jinja2 builds a context (ChainMaps, a frame) per render: ~10 us of a ~250 us request
    # (py-spy, wrk c=64). Anything but plain strings goes to Jinja2, which judges it.
    parts = []
    for m in messages:
        role, content = m.get("role"), m["content"]
        if type(role) is not str or type(content) is not str:
            return None
        parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


class ChatTemplate:
    """A compiled chat template plus the special tokens it may reference."""

    def __init__(
        self, source: str = DEFAULT_TEMPLATE, bos_token: str = "", eos_token: str = ""
    ) -> None:
        # Same environment options as transformers' apply_chat_template, so renders match.
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        env.filters["tojson"] = lambda v, indent=None: json.dumps(
            v, ensure_ascii=False, indent=indent
        )
        try:
            self._template = env.from_string(source)
        except Exception as exc:
            raise ChatTemplateError(f"invalid chat template: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        # Template.render merges the environment's globals (a ChainMap) into a fresh dict on
        # every call: ~4% of the gateway's CPU per request under load (py-spy, wrk c=64).
        # Flattened once here, they go in with each render's variables instead.
        self._globals = dict(self._template.globals)
        # The default template is rendered by _chatml, byte for byte (tested against Jinja2).
        self._fast = source == DEFAULT_TEMPLATE

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Render messages to the prompt text the replica tokenizes."""
        msgs = [{**m, "content": _content_text(m.get("content"))} for m in messages]
        if self._fast:
            text = _chatml(msgs, add_generation_prompt)
            if text is not None:
                return text
        return self._render(msgs, add_generation_prompt)

    def _render(self, msgs: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """Jinja2's rendering of the template (every template; the default's odd input)."""
        try:
            variables = {
                **self._globals,
                "messages": msgs,
                "add_generation_prompt": add_generation_prompt,
                "bos_token": self.bos_token,
                "eos_token": self.eos_token,
            }
            # What Template.render does, less its per-call globals merge (shared: the dict
            # above already holds the globals).
            template = self._template
            return "".join(template.root_render_func(template.new_context(variables, shared=True)))
        except ChatTemplateError:
            raise
        except Exception as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc


def load_chat_template(path: str | None) -> ChatTemplate:
    """`None` -> default template; else a dir with tokenizer_config.json (or that file)."""
    if path is None:
        return ChatTemplate()
    file = os.path.join(path, "tokenizer_config.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
        return ChatTemplate()
    try:
        with open(file, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ChatTemplateError(f"cannot read {file}: {exc}") from exc
    source = cfg.get("chat_template")
    if isinstance(source, list):  # some configs hold named templates
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default") or next(iter(named.values()), None)
    if not isinstance(source, str):
        source = DEFAULT_TEMPLATE
    return ChatTemplate(
        source, _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
    )
