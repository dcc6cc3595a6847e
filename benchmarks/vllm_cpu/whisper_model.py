"""A tiny Whisper model directory made from nothing but packages: config, tokenizer, processor."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from benchmarks.vllm_cpu.model import _corpus
from simulator.audio import WHISPER_LANGUAGES

WHISPER_NAME = "tiny-whisper"
# Whisper's decoder positions (max_target_positions): vLLM's context length for it.
WHISPER_MAX_LEN = 448
BPE_SIZE = 1024
EOT = "<|endoftext|>"
SPECIAL_TOKENS = (
    EOT,
    "<|startoftranscript|>",
    # vLLM looks up <|xx|> for its languages (detection constrains the first token to them).
    *(f"<|{code}|>" for code in WHISPER_LANGUAGES),
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
)
# Not special, right after the specials: verbose_json finds segments by id >= <|0.00|>.
TIMESTAMPS = tuple(f"<|{i * 0.02:.2f}|>" for i in range(1501))
VOCAB_SIZE = BPE_SIZE + len(SPECIAL_TOKENS) + len(TIMESTAMPS)
EOT_ID = BPE_SIZE
SOT_ID = BPE_SIZE + 1
# head_dim 64 (d_model / heads): the CPU attention kernel rejects smaller heads. The encoder
# keeps Whisper's 80 mel bins and 1500 positions (30 s of audio after the 2x conv stride).
WHISPER_CONFIG: dict[str, object] = {
    "architectures": ["WhisperForConditionalGeneration"],
    "model_type": "whisper",
    "is_encoder_decoder": True,
    "vocab_size": VOCAB_SIZE,
    "num_mel_bins": 80,
    "d_model": 64,
    "encoder_layers": 1,
    "encoder_attention_heads": 1,
    "encoder_ffn_dim": 128,
    "decoder_layers": 1,
    "decoder_attention_heads": 1,
    "decoder_ffn_dim": 128,
    "max_source_positions": 1500,
    "max_target_positions": WHISPER_MAX_LEN,
    "activation_function": "gelu",
    "scale_embedding": False,
    "use_cache": True,
    "torch_dtype": "float32",
    "bos_token_id": EOT_ID,
    "eos_token_id": EOT_ID,
    "pad_token_id": EOT_ID,
    "decoder_start_token_id": SOT_ID,
    "begin_suppress_tokens": [EOT_ID],
    "suppress_tokens": [],
}
# max_new_tokens bounds every answer of the random weights (which rarely pick EOT) so that a
# test's transcription takes milliseconds; a request's max_completion_tokens still applies.
GENERATION_CONFIG = {
    "decoder_start_token_id": SOT_ID,
    "bos_token_id": EOT_ID,
    "eos_token_id": EOT_ID,
    "pad_token_id": EOT_ID,
    "max_length": WHISPER_MAX_LEN,
    "max_new_tokens": 16,
    "no_timestamps_token_id": SOT_ID + len(WHISPER_LANGUAGES) + 6,
}
PREPROCESSOR_CONFIG = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "processor_class": "WhisperProcessor",
    "feature_size": 80,
    "sampling_rate": 16000,
    "hop_length": 160,
    "n_fft": 400,
    "chunk_length": 30,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": False,
}


def _train_tokenizer_json() -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed=1), trainer=trainer)
    if tok.get_vocab_size() != BPE_SIZE:
        raise RuntimeError(f"BPE vocabulary has {tok.get_vocab_size()} tokens, not {BPE_SIZE}")
    # Added in Whisper's order after the BPE tokens: ids are EOT_ID, SOT_ID, languages, ...
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TIMESTAMPS])
    return str(tok.to_str(pretty=True))


def _tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "pad_token": EOT,
        "model_max_length": WHISPER_MAX_LEN,
        "clean_up_tokenization_spaces": False,
        "processor_class": "WhisperProcessor",
    }


def _fingerprint() -> str:
    blob = json.dumps(
        [
            WHISPER_CONFIG,
            GENERATION_CONFIG,
            PREPROCESSOR_CONFIG,
            _tokenizer_config(),
            SPECIAL_TOKENS,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def whisper_dir(root: Path) -> Path:
    """Where the Whisper model for this exact recipe lives."""
    return root / f"{WHISPER_NAME}-{_fingerprint()}"


def ensure_whisper(root: Path) -> tuple[Path, bool]:
    """Create the Whisper model directory unless present; returns (path, created)."""
    path = whisper_dir(root)
    done = path / "READY"
    if done.is_file():
        return path, False
    path.mkdir(parents=True, exist_ok=True)
    special = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "pad_token": EOT}
    files = {
        "tokenizer.json": _train_tokenizer_json(),
        "tokenizer_config.json": json.dumps(_tokenizer_config(), indent=2),
        "special_tokens_map.json": json.dumps(special, indent=2),
        "config.json": json.dumps(WHISPER_CONFIG, indent=2),
        "generation_config.json": json.dumps(GENERATION_CONFIG, indent=2),
        "preprocessor_config.json": json.dumps(PREPROCESSOR_CONFIG, indent=2),
    }
    for name, text in files.items():
        (path / name).write_text(text)
    done.write_text(WHISPER_NAME + "\n")
    return path, True
