"""A tiny all-zero LoRA adapter for the tiny model, written without torch or safetensors."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LORA_NAME = "tiny-lora"
LORA_RANK = 8
_TARGETS = ("q_proj", "v_proj")


def _shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    hidden, head_dim = int(config["hidden_size"]), int(config["head_dim"])
    out_dims = {
        "q_proj": int(config["num_attention_heads"]) * head_dim,
        "v_proj": int(config["num_key_value_heads"]) * head_dim,
    }
    shapes: dict[str, tuple[int, int]] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for target in _TARGETS:
            key = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            shapes[f"{key}.lora_A.weight"] = (LORA_RANK, hidden)
            shapes[f"{key}.lora_B.weight"] = (out_dims[target], LORA_RANK)
    return shapes


def _safetensors(shapes: dict[str, tuple[int, int]]) -> bytes:
    # The format is an 8-byte little-endian header length, a JSON header, then raw tensors.
    header: dict[str, object] = {}
    offset = 0
    for name, (rows, cols) in sorted(shapes.items()):
        size = rows * cols * 4
        header[name] = {
            "dtype": "F32",
            "shape": [rows, cols],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def write_lora(path: Path, base_model: str, config: Mapping[str, Any]) -> None:
    """A valid PEFT adapter whose update is exactly zero (B = 0): outputs match the base."""
    path.mkdir(parents=True, exist_ok=True)
    adapter = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": LORA_RANK,
        "lora_alpha": 2 * LORA_RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(_TARGETS),
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (path / "adapter_config.json").write_text(json.dumps(adapter, indent=2))
    (path / "adapter_model.safetensors").write_bytes(_safetensors(_shapes(config)))
