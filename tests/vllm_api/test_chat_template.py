"""The default template's Jinja2-free rendering matches Jinja2's byte for byte."""

from __future__ import annotations

import random
from typing import Any

import pytest

from vllm_api.chat_template import DEFAULT_TEMPLATE, ChatTemplate, ChatTemplateError

_PIECES = ("", "a", " ", "\n", "\t", "{{ x }}", "{% if %}", "<|im_end|>", "é", "日本", "\\n", "'")


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.randrange(6)))


def _messages(rng: random.Random) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(rng.randrange(5)):
        content: Any = _text(rng)
        if rng.random() < 0.2:  # OpenAI content parts: text parts joined, others dropped
            content = [{"type": "text", "text": _text(rng)}, {"type": "image_url"}]
        elif rng.random() < 0.1:
            content = None
        out.append(
            {"role": rng.choice(("system", "user", "assistant", _text(rng))), "content": content}
        )
    return out


def test_default_template_matches_jinja2() -> None:
    rng = random.Random(17)
    template = ChatTemplate()
    for _ in range(500):
        messages = _messages(rng)
        gen = rng.random() < 0.5
        msgs = [{**m, "content": m["content"]} for m in messages]
        for m in msgs:  # as render prepares them for either path
            c = m["content"]
            if isinstance(c, list):
                m["content"] = "\n".join(p["text"] for p in c if p.get("type") == "text")
            elif c is None:
                m["content"] = ""
        assert template.render(messages, gen) == template._render(msgs, gen)


def test_default_template_skips_jinja2(monkeypatch: pytest.MonkeyPatch) -> None:
    template = ChatTemplate()

    def boom(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("Jinja2 rendered the default template")

    monkeypatch.setattr(template._template, "new_context", boom)
    text = template.render([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "message",
    [{"content": "no role"}, {"role": 3, "content": "x"}, {"role": "user", "content": 5}],
)
def test_odd_input_goes_to_jinja2_and_fails_as_before(message: dict[str, Any]) -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate().render([message])


def test_other_templates_render_with_jinja2() -> None:
    # Same output as the default, different source: not the fast path, still rendered.
    source = DEFAULT_TEMPLATE.replace("assistant", "model")
    template = ChatTemplate(source)
    assert not template._fast
    text = template.render([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>model\n"
