"""Model shapes read from HF ``config.json`` files (torch-free: the simulator sizes KV caches from them).

Shipped configs live in ``engine/configs/<name>/config.json`` and are accepted by name anywhere a
model is asked for (``qwen3-0.6b``); any other value is a path to an HF model directory.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from engine.core.json_errors import json_problem, json_type_name
from engine.core.messages import one_line

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")
# transformers' defaults where config.json leaves max_position_embeddings out (it sets the default max_model_len): one
# 4096 for all had Qwen models, which default to 32768 there, refuse prompts transformers and vLLM take.
DEFAULT_MAX_POSITION_EMBEDDINGS = {"Qwen3ForCausalLM": 32768, "Qwen2ForCausalLM": 32768, "LlamaForCausalLM": 2048}
# transformers' Qwen2Config / Qwen3Config class defaults where config.json leaves the key out (Llama derives both).
QWEN_DEFAULT_KV_HEADS = 32
QWEN3_DEFAULT_HEAD_DIM = 128


# Token ids are hashed as 32-bit integers (engine.core.block_manager), and no real vocabulary comes near.
_VOCAB_LIMIT = 2**32
# Any real layer, head or context count is far below this; past it sizes overflow int64 arithmetic downstream.
_SIZE_LIMIT = 2**40


class _SizeReader:
    """Reads a config.json's sizes as positive integers (an integral float such as 1024.0 passes; 1024.5,
    text, booleans and nulls do not), naming the file and key in every error: a zero, negative or
    fractional size would otherwise surface far away, as a zero division or a nonsense KV cache."""

    def __init__(self, config: dict, source: str) -> None:
        self.config = config
        self.source = source

    def _value(self, key: str, default):
        value = self.config.get(key)
        if value is None:
            if default is None:
                raise ValueError(f"{self.source}: missing key {key!r}")
            return default
        return value

    def get(self, key: str, default: int | None = None, limit: int = _SIZE_LIMIT) -> int:
        value = self._value(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or value != int(value) or not 1 <= value < limit:
            raise ValueError(f"{self.source}: {key!r} is {value!r}; expected an integer >= 1 and < "
                             f"2**{limit.bit_length() - 1}")
        return int(value)

    def positive_float(self, key: str, default: float) -> float:
        value = self._value(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ValueError(f"{self.source}: {key!r} is {value!r}; expected a finite number > 0")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        """A true/false setting: the text "false" was truthy, and tied the LM head of an untied model."""
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"{self.source}: {key!r} is {value!r}; expected true or false")
        return value

    def token_ids(self, key: str, vocab_size: int | None = None) -> tuple[int, ...]:
        """Token ids, each below ``vocab_size`` where it is known: an end-of-sequence id outside the vocabulary can
        never be sampled, and generation ran on to max_tokens without a word. Refused, as vLLM refuses stop_token_ids
        outside the vocabulary (and onnxruntime-genai such an eos_token_id); a config.json whose vocab_size is wrong
        is refused here too, not only by its checkpoint's shapes."""
        value = self.config.get(key)
        ids = value if isinstance(value, list) else ([] if value is None else [value])
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < _VOCAB_LIMIT for i in ids):
            raise ValueError(f"{self.source}: {key!r} is {value!r}; expected a token id or a list of them")
        bad = next((i for i in ids if vocab_size is not None and i >= vocab_size), None)
        if bad is not None:
            raise ValueError(f"{self.source}: {key!r} has {bad}, outside the vocabulary [0, {vocab_size}) "
                             "(vocab_size); it could never end a generation")
        return tuple(ids)


SUPPORTED_ROPE_TYPES = (None, "default", "llama3")  # engine.gpu.layers.rotary_embedding computes these


def _refuse_unsupported(config: dict, source: str, arch: str) -> None:
    """Settings the engine's decoder does not implement: transformers honours them, so running without them gave
    other tokens than the model's, without a word (a checkpoint with MLP biases failed in the loader instead)."""
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"{source}: 'hidden_act' is {act!r}; the engine implements only silu (SwiGLU)")
    quantization = config.get("quantization_config")
    if quantization is not None:  # its weights (fp8, int4 with scales) would load as plain floats, or fail by tensor
        method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
        raise ValueError(f"{source}: 'quantization_config' asks for {str(method)[:40]!r} quantization; the engine "
                         "loads only unquantized (bfloat16, float16, float32) weights")
    # Llama's alone: transformers' Qwen2 and Qwen3 build their MLPs without biases whatever 'mlp_bias' says (their
    # checkpoints have none), and such a config.json was refused though the engine runs it as transformers does.
    if config.get("mlp_bias") and arch == "LlamaForCausalLM":
        raise ValueError(f"{source}: 'mlp_bias' is {config['mlp_bias']!r}; the engine has no MLP biases")
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list):
        sliding = any(t != "full_attention" for t in layer_types)
    else:  # transformers 4: Qwen2/Qwen3 layers from max_window_layers on slide when use_sliding_window is set
        window_layers = config.get("max_window_layers", 28)
        num_layers = config.get("num_hidden_layers")
        sliding = bool(config.get("use_sliding_window")) and config.get("sliding_window") is not None and (
            not isinstance(window_layers, int) or not isinstance(num_layers, int) or window_layers < num_layers)
    if sliding:
        raise ValueError(f"{source}: sliding-window attention ('use_sliding_window', 'layer_types') is not "
                         "supported; the engine attends to the whole context in every layer")


def _check_llama3_scaling(scaling: dict, source: str) -> None:
    """Llama 3's frequency scaling needs its factors as numbers, the high one above the low one: a missing factor
    was a KeyError and a text one a TypeError when the model was built (the simulator, which builds none, took
    them), and equal factors divided by zero, giving NaN frequencies and other tokens without a word. A missing
    low_freq_factor or high_freq_factor was taken as Llama 3.1's 1 or 4 where transformers refuses the config ("Missing
    required keys ... for 'rope_type'='llama3'"): the engine ran a model on factors its file never named."""
    numbers = {}
    for key in ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"):
        value = scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ValueError(f"{source}: rope scaling's {key!r} is {value!r}; expected a finite number > 0 "
                             "(llama3 scaling needs factor, original_max_position_embeddings, low_freq_factor and "
                             "high_freq_factor)")
        numbers[key] = value
    if numbers["high_freq_factor"] <= numbers["low_freq_factor"]:
        raise ValueError(f"{source}: rope scaling's 'high_freq_factor' ({numbers['high_freq_factor']}) is not above "
                         f"its 'low_freq_factor' ({numbers['low_freq_factor']})")


def _rope_theta(rope: dict, key: str, source: str) -> float | None:
    """The rope_theta inside rope_parameters (transformers 5 keeps it there) or rope_scaling; None where it has none."""
    value = rope.get("rope_theta")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{source}: {key}' 'rope_theta' is {value!r}; expected a finite number > 0")
    return float(value)


def shipped_models() -> list[str]:
    return sorted(p.parent.name for p in CONFIG_DIR.glob("*/config.json"))


def resolve_model_dir(model: str | Path) -> Path:
    """A shipped config's name or an HF model directory; a clear error otherwise."""
    path = Path(model)
    try:
        if (path / "config.json").is_file():
            return path
        shipped = CONFIG_DIR / str(model)
        if (shipped / "config.json").is_file():
            return shipped
        is_file = path.is_file()
    except OSError as exc:  # a name past 255 bytes: is_file() raises (Python 3.11 passes over a missing file only);
        # engine.serve --model NAME was a traceback, and LLM(NAME) an OSError that listed no shipped config
        raise FileNotFoundError(f"model {one_line(repr(str(model)), 80)} cannot be a model folder "
                                f"({exc.strerror or exc}) nor is it a shipped config; shipped: "
                                f"{', '.join(shipped_models())}") from None
    if is_file:  # 'model directory X has no config.json' read as if X were a folder
        raise FileNotFoundError(f"model {path} is a file; expected a model folder holding config.json, or a shipped "
                                f"config: {', '.join(shipped_models())}")
    if path.exists():
        raise FileNotFoundError(f"model directory {path} has no config.json")
    raise FileNotFoundError(
        f"model {str(model)!r} is neither a directory with a config.json nor a shipped config; "
        f"shipped: {', '.join(shipped_models())}"
    )


def generation_eos_token_ids(model_dir: Path, vocab_size: int | None = None) -> tuple[int, ...]:
    """The end-of-sequence ids of the model's generation_config.json (none without one). Instruct models list more
    there than config.json does (Qwen's chat models end a turn with <|im_end|> and end text with <|endoftext|>, only
    the first in config.json); vLLM stops on them all, and a model that ended its answer with another ran on until
    max_tokens."""
    source = Path(model_dir) / "generation_config.json"
    if not source.is_file():
        return ()
    return _SizeReader(read_generation_config(source), str(source)).token_ids("eos_token_id", vocab_size)


def read_generation_config(source: Path) -> dict:
    """A generation_config.json as a dict; a file that is not a JSON object is one line naming it. Its eos ids and
    its sampling defaults (engine.core.generation_defaults) are read from here."""
    config = read_model_json(source)
    if not isinstance(config, dict):
        raise ValueError(f"{source}: top level is a JSON {json_type_name(config)}; expected an object")
    return config


# config.json and generation_config.json hold a few KB, a sharded checkpoint's index some hundred KB: a larger file is
# none of them (1 GB of brackets took 2 GB of memory before JSON refused it, and a sparse file of 100 GB all of that).
MAX_MODEL_JSON_BYTES = 64 * 2**20


def read_model_json(source: Path) -> object:
    """The parsed JSON of a model folder's file (config.json, generation_config.json, the checkpoint's index); one
    line naming the file where it cannot be: arrays nested thousands deep were a RecursionError traceback and an
    integer of 5000 digits Python's message alone, naming no file."""
    try:
        size_bytes = source.stat().st_size
        data = None if size_bytes > MAX_MODEL_JSON_BYTES else source.read_bytes()
    except OSError as exc:  # a folder or an unreadable file of that name
        raise ValueError(f"{source}: cannot read it ({exc.strerror or exc})") from None
    if data is None:
        raise ValueError(f"{source}: {size_bytes:,} bytes; expected a JSON file of at most "
                         f"{MAX_MODEL_JSON_BYTES // 2**20} MiB")
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:  # its line and column, which json_problem leaves out
        raise ValueError(f"{source}: not valid JSON ({exc})") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8, too long a number, nested too deeply
        raise ValueError(f"{source}: not valid JSON ({json_problem(exc)})") from None


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
        if not isinstance(config, dict):
            raise ValueError(f"{source}: top level is a JSON {json_type_name(config)}; expected an object")
        architectures = config.get("architectures") or [None]
        arch = architectures[0] if isinstance(architectures, list) else architectures
        if not isinstance(arch, str) or arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"{source}: unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        _refuse_unsupported(config, source, arch)
        size = _SizeReader(config, source)
        num_heads = size.get("num_attention_heads")
        hidden = size.get("hidden_size")
        # transformers' Qwen2Config and Qwen3Config give a config.json without num_key_value_heads their class
        # default, 32, and only a null one num_attention_heads (as Llama takes a missing one): the engine took
        # num_attention_heads for both, and refused by its k_proj shape a 64-head Qwen checkpoint transformers runs.
        qwen_default_kv = arch != "LlamaForCausalLM" and "num_key_value_heads" not in config
        num_kv_heads = size.get("num_key_value_heads", QWEN_DEFAULT_KV_HEADS if qwen_default_kv else num_heads)
        if num_heads % num_kv_heads:  # grouped-query attention shares each KV head among whole query groups
            left_out = ", transformers' Qwen default where config.json has none" if qwen_default_kv else ""
            raise ValueError(f"{source}: num_attention_heads ({num_heads}) is not a multiple of "
                             f"num_key_value_heads ({num_kv_heads}{left_out})")
        # transformers 5 folds rope_theta and rope_scaling into rope_parameters, and reads the older rope_scaling over
        # it where that is set, and the rope_theta inside the object over a top-level one (transformers 4 knew
        # rope_scaling and a top-level rope_theta only). rope_parameters' theta was taken beside a rope_scaling, which
        # transformers ignores, and rope_scaling's own theta was passed over: other tokens, without a word.
        rope_key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
        rope = config.get(rope_key) or {}
        if not isinstance(rope, dict):
            raise ValueError(f"{source}: {rope_key!r} is {rope!r}; expected an object")
        kind = rope.get("rope_type") or rope.get("type")
        rope_scaling = None if kind in (None, "default") else rope
        # Checked here, where the file is named: the rotary table refused another kind only when the model was built,
        # and the simulator (which builds none) accepted it.
        if kind not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"{source}: rope scaling type {kind!r} is not supported; supported: "
                             f"{', '.join(str(k) for k in SUPPORTED_ROPE_TYPES if k)}")
        if kind == "llama3":
            _check_llama3_scaling(rope_scaling, source)
            # transformers turns only that part of each head with llama3 scaling (the rope object's value over a
            # top-level one), then fails to apply it to the whole head (a shape error); the engine turned the whole
            # head, giving tokens for a model transformers cannot run, without a word. (Default rope ignores it in
            # transformers 5, as the engine does.)
            partial = rope_scaling.get("partial_rotary_factor", config.get("partial_rotary_factor"))
            if partial is not None and partial != 1:
                raise ValueError(f"{source}: 'partial_rotary_factor' is {partial!r} with llama3 rope scaling; expected "
                                 "1 (the whole head turned; transformers fails on a part of it)")
            # transformers 5 takes a top-level one over the rope object's (as Phi-3 keeps it), transformers 4 ignores it
            top = config.get("original_max_position_embeddings")
            inner = rope_scaling["original_max_position_embeddings"]
            if top is not None and top != inner:
                raise ValueError(f"{source}: 'original_max_position_embeddings' ({top!r}) and {rope_key}' "
                                 f"'original_max_position_embeddings' ({inner!r}) differ; expected one value")
        # rope_parameters' rope_theta of 0 was taken for "unset" and became 10000 without a word
        inner_theta = _rope_theta(rope, rope_key, source)
        rope_theta = size.positive_float("rope_theta", 10000.0 if inner_theta is None else inner_theta)
        if inner_theta is not None and config.get("rope_theta") is not None and rope_theta != inner_theta:
            # transformers 4 takes the top-level one, 5 the other: which the model was trained with is unknown
            raise ValueError(f"{source}: 'rope_theta' ({rope_theta:g}) and {rope_key}' 'rope_theta' ({inner_theta:g}) "
                             "differ; expected one value")
        vocab_size = size.get("vocab_size", limit=_VOCAB_LIMIT)
        # Rotary embeddings turn pairs of dimensions: an odd head_dim failed every request in the engine (a shape
        # error in each step), and one of 0 derived from more heads than hidden_size was said to be head_dim's own.
        # transformers' Qwen3Config gives a config.json without head_dim its class default, 128 (Qwen3's own), where
        # Llama and Qwen2 derive hidden_size // num_attention_heads: the engine derived it for Qwen3 too, and refused
        # the checkpoint transformers runs ("the sizes in config.json give (16,)", sizes config.json never gave).
        derived = QWEN3_DEFAULT_HEAD_DIM if arch == "Qwen3ForCausalLM" else hidden // num_heads
        if "head_dim" in config and config["head_dim"] is None and arch != "LlamaForCausalLM":
            # transformers' Qwen3Config refuses a null one and its Qwen2 model fails on it (Llama derives it)
            raise ValueError(f"{source}: 'head_dim' is None; expected an integer >= 1, or no 'head_dim' at all")
        if config.get("head_dim") is None and (derived == 0 or derived % 2):
            raise ValueError(f"{source}: 'hidden_size' ({hidden}) // 'num_attention_heads' ({num_heads}) is {derived}; "
                             "without a 'head_dim' that is the head dimension, and rotary embeddings need an even one")
        head_dim = size.get("head_dim", derived)
        if head_dim % 2:
            raise ValueError(f"{source}: 'head_dim' is {head_dim}; rotary embeddings need an even head dimension")
        return cls(
            name=name,
            architecture=arch,
            hidden_size=hidden,
            intermediate_size=size.get("intermediate_size"),
            num_layers=size.get("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            vocab_size=vocab_size,
            max_position_embeddings=size.get("max_position_embeddings", DEFAULT_MAX_POSITION_EMBEDDINGS[arch]),
            tie_word_embeddings=size.flag("tie_word_embeddings", False),
            # Qwen2 has q/k/v biases and no q/k norms; Qwen3 the reverse; Llama neither. Qwen2's are there whatever
            # 'attention_bias' says (transformers and vLLM build them unconditionally): a Qwen2 config.json with
            # "attention_bias": false was built without them and its checkpoint refused.
            attention_bias=arch == "Qwen2ForCausalLM" or size.flag("attention_bias", False),
            qk_norm=arch == "Qwen3ForCausalLM",
            rms_norm_eps=size.positive_float("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            eos_token_ids=size.token_ids("eos_token_id", vocab_size),
            torch_dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
        )

    @classmethod
    def load(cls, model: str | Path) -> ModelShape:
        model_dir = resolve_model_dir(model)
        source = model_dir / "config.json"
        config = read_model_json(source)
        # The folder's name, however it was named: a shipped config given as its folder (LLM passes the resolved one)
        # was named by its whole path, so engine errors spelt out /.../engine/configs/qwen3-0.6b, profiles recorded it
        # and the simulator, finding no profile under that name, priced --model /.../qwen3-0.6b with the roofline. Made
        # absolute first (links not followed): '.' and '..' have no name of their own, and --model . was the model ''.
        name = Path(os.path.abspath(model_dir)).name
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
