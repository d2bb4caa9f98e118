"""Model shapes read from HF ``config.json`` files (torch-free: the simulator sizes KV caches from them).

Shipped configs live in ``engine/configs/<name>/config.json`` and are accepted by name anywhere a
model is asked for (``qwen3-0.6b``); any other value is a path to an HF model directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")


def shipped_models() -> list[str]:
    return sorted(p.parent.name for p in CONFIG_DIR.glob("*/config.json"))


def resolve_model_dir(model: str | Path) -> Path:
    """A shipped config's name or an HF model directory; a clear error otherwise."""
    path = Path(model)
    if (path / "config.json").is_file():
        return path
    shipped = CONFIG_DIR / str(model)
    if (shipped / "config.json").is_file():
        return shipped
    if path.exists():
        raise FileNotFoundError(f"model directory {path} has no config.json")
    raise FileNotFoundError(
        f"model {str(model)!r} is neither a directory with a config.json nor a shipped config; "
        f"shipped: {', '.join(shipped_models())}"
    )


@dataclass(frozen=True)
class ModelShape:
    name: str
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str

    @classmethod
    def from_config_dict(cls, config: dict, name: str, source: str = "config.json") -> ModelShape:
        architectures = config.get("architectures") or [None]
        arch = architectures[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"{source}: unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        try:
            num_heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            # transformers 5 folds rope_theta and rope_scaling into rope_parameters.
            rope = config.get("rope_parameters") or {}
            rope_scaling = config.get("rope_scaling")
            if rope_scaling is None and rope.get("rope_type", "default") != "default":
                rope_scaling = rope
            eos = config.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                name=name,
                architecture=arch,
                hidden_size=hidden,
                intermediate_size=int(config["intermediate_size"]),
                num_layers=int(config["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
                head_dim=int(config.get("head_dim") or hidden // num_heads),
                vocab_size=int(config["vocab_size"]),
                max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                # Qwen2 has q/k/v biases and no q/k norms; Qwen3 the reverse; Llama neither.
                attention_bias=bool(config.get("attention_bias", arch == "Qwen2ForCausalLM")),
                qk_norm=arch == "Qwen3ForCausalLM",
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0),
                rope_scaling=rope_scaling,
                eos_token_ids=eos_ids,
                torch_dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
            )
        except KeyError as exc:
            raise ValueError(f"{source}: missing key {exc.args[0]!r}") from None

    @classmethod
    def load(cls, model: str | Path) -> ModelShape:
        model_dir = resolve_model_dir(model)
        source = model_dir / "config.json"
        try:
            config = json.loads(source.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: not valid JSON ({exc})") from None
        name = model_dir.name if model_dir.parent != CONFIG_DIR else str(model)
        return cls.from_config_dict(config, name=name, source=str(source))

    # ---- derived sizes (per model, before tensor parallelism) ------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_layer_params(self) -> int:
        """Parameters in one decoder layer's matrices (norms and biases are negligible)."""
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return attn + mlp

    @property
    def num_embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.num_embedding_params
        return self.num_layers * self.num_layer_params + self.num_embedding_params + lm_head

    def kv_bytes_per_token(self, dtype_bytes: int = 2, tensor_parallel_size: int = 1) -> int:
        """K and V of every layer for one token, on one rank (KV heads are split across ranks)."""
        kv_heads = max(1, self.num_kv_heads // tensor_parallel_size)
        return 2 * self.num_layers * kv_heads * self.head_dim * dtype_bytes

    def weight_bytes(self, dtype_bytes: int = 2, tensor_parallel_size: int = 1) -> int:
        return self.num_params * dtype_bytes // tensor_parallel_size
