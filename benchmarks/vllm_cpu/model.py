"""A tiny Llama model directory made from nothing but packages: config and a trained tokenizer."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path

from benchmarks.vllm_cpu.lora import write_lora

MODEL_NAME = "tiny-llama"
VOCAB_SIZE = 2048
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
BOS, EOS = "<s>", "</s>"
# ChatML with a leading BOS, like Llama-3-style templates: vLLM renders it and then tokenizes
# WITHOUT adding special tokens, while plain completions get the post-processor's BOS.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# head_dim 64: the CPU attention kernel rejects smaller heads.
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_WORDS_TEXT = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu amber basil "
    "cedar dune ember fern grove heath iris jade kelp lotus maple nectar olive the a an of to "
    "and in is it you that he was for on are with as his they be at one have this from or had "
    "by hot word but what some we can out other were all there when up use your how said each "
    "she which do their time if will way about many then them write would like so these her "
    "long make thing see him two has look more day could go come did number sound no most "
    "people my over know water than call first who may down side been now find any new work "
    "part take get place made live where after back little only round man year came show "
    "every good me give our under name very through just form sentence great think say help "
    "low line differ turn cause much mean before move right boy old too same tell does set "
    "three want air well also play small end put home read hand port large spell add even "
    "land here must big high such follow act why ask men change went light kind off need "
    "house picture try us again animal point mother world near build self earth father hello "
    "system user assistant question answer please explain request model cache prefix token "
    "item run document chapter section summary context instruction story shared"
)
_WORDS = tuple(_WORDS_TEXT.split())
_PUNCT = (".", ",", "!", "?", ":", ";", "'", '"', "-", "(", ")", "\n")


def _corpus(seed: int = 0, lines: int = 6000) -> Iterator[str]:
    """Deterministic text: words, numbers and punctuation in random mixes."""
    rng = random.Random(seed)
    for _ in range(lines):
        parts: list[str] = []
        for _ in range(rng.randint(4, 24)):
            r = rng.random()
            if r < 0.8:
                w = rng.choice(_WORDS)
                parts.append(w.capitalize() if rng.random() < 0.1 else w)
            elif r < 0.9:
                parts.append(str(rng.randint(0, 99999)))
            else:
                parts.append(rng.choice(_PUNCT))
        yield " ".join(parts)


def _train_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return str(tok.to_str(pretty=True))


def _tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": "<unk>",
        "pad_token": EOS,
        "model_max_length": LLAMA_CONFIG["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _fingerprint() -> str:
    blob = json.dumps([LLAMA_CONFIG, _tokenizer_config(), VOCAB_SIZE, _WORDS], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def model_dir(root: Path) -> Path:
    """Where the model for this exact recipe lives (a recipe change makes a new directory)."""
    return root / f"{MODEL_NAME}-{_fingerprint()}"


def lora_dir(root: Path) -> Path:
    """The tiny LoRA adapter beside the model (not inside: the model dir is globbed)."""
    return root / f"{MODEL_NAME}-{_fingerprint()}-lora"


def ensure_model(root: Path) -> tuple[Path, bool]:
    """Create the model and LoRA directories unless present; returns (model path, created)."""
    path = model_dir(root)
    done = path / "READY"
    if done.is_file():
        return path, False
    write_lora(lora_dir(root), MODEL_NAME, LLAMA_CONFIG)
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(_train_tokenizer_json())
    (path / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(), indent=2))
    special = {"bos_token": BOS, "eos_token": EOS, "unk_token": "<unk>", "pad_token": EOS}
    (path / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    (path / "config.json").write_text(json.dumps(LLAMA_CONFIG, indent=2))
    gen = {"bos_token_id": 1, "eos_token_id": 2}
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2))
    done.write_text(MODEL_NAME + "\n")
    return path, True
