# Tests for vllm_api/tokenizer.py and vllm_api/chat_template.py (owned by the simulator).
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from simulator.text import OutputVocab
from vllm_api.chat_template import ChatTemplate, ChatTemplateError, load_chat_template
from vllm_api.tokenizer import BuiltinTokenizer, HFTokenizer, load_tokenizer

PROSE = (
    "The history of the city begins with a small settlement on the river, where farmers and "
    "traders met to exchange grain, cloth and news. Over the centuries the market grew into a "
    "busy port, and merchants built warehouses along the water. "
) * 5


def test_builtin_is_deterministic_and_about_four_chars_per_token() -> None:
    a, b = BuiltinTokenizer(), BuiltinTokenizer()
    ids = a.encode(PROSE)
    assert ids == b.encode(PROSE)
    assert 3.5 <= len(PROSE) / len(ids) <= 4.5
    assert all(256 <= i < 32000 for i in ids)
    assert a.encode("abc") != a.encode("abd")
    assert load_tokenizer(None).encode(PROSE) == ids


def test_builtin_decodes_the_simulator_output() -> None:
    tok = BuiltinTokenizer()
    vocab = OutputVocab(tok, seed=0)
    off = vocab.offset([1, 2, 3])
    assert tok.decode(vocab.token_ids(off, 0, 12)) == vocab.text(off, 0, 12)
    assert tok.encode(vocab.text(off, 0, 12)) == vocab.token_ids(off, 0, 12)


def _hf_dir(tmp_path: Path) -> Path:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator([PROSE] * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    cfg = {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>"},
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] "
        "{{ m['content'] }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant] "
        "{% endif %}",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_hf_tokenizer_adds_bos_like_vllm(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path)
    tok = load_tokenizer(str(d))
    assert isinstance(tok, HFTokenizer)
    ids = tok.encode("the river")
    assert ids[0] == 1 and tok.encode_plain("the river") == ids[1:]
    assert tok.decode(ids) == "the river"


def test_chat_template_from_config_and_default(tmp_path: Path) -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    t = load_chat_template(str(_hf_dir(tmp_path)))
    assert t.render(msgs) == "<s>[user] hi</s>[assistant] "
    assert t.render(msgs, add_generation_prompt=False) == "<s>[user] hi</s>"
    d = load_chat_template(None)
    assert d.render([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_template_is_sandboxed_and_errors_are_typed() -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ raise_exception('no system role') }}").render([])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])
