"""Options of ``engine.LLM``: the shared ``EngineConfig`` plus what only a real runner needs (torch-free).

Names follow nano-vLLM and vLLM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from engine.core.config import ConfigError, EngineConfig, check, check_choice, check_int, option

DTYPES = ("auto", "bfloat16", "float16", "float32")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
ATTENTION_BACKENDS = ("auto", "triton", "flash_attn", "torch")
CUDA_ATTENTION_BACKENDS = ("triton", "flash_attn")  # the kernels that run on a CUDA device only
DISTRIBUTED_BACKENDS = ("auto", "nccl", "gloo")
INT32_LIMIT = 2**31
# torch keeps a device index in 8 signed bits: cuda:128 became cuda:-128 and cuda:255 plain cuda. Digits only, no
# leading zero: 'cuda:x', 'cuda:-1', 'cuda:1.5' and 'cuda:0 ' passed the option check and were a torch traceback.
CUDA_DEVICE = re.compile(r"cuda:(0|[1-9][0-9]{0,2})")
MAX_CUDA_INDEX = 127
# vLLM's other spellings of a dtype (its LLM(dtype="half") and a torch.dtype); refused here as not among DTYPES.
_DTYPE_ALIASES = {"half": "float16", "float": "float32"}


def canonical_dtype(name: object) -> object:
    """``name`` as one of DTYPES where it is one of vLLM's other spellings ("half"); anything else as it is (the
    options' check refuses it). One rule for LLM(dtype=...) and --dtype: LLM took "half" and --dtype refused it."""
    return _DTYPE_ALIASES.get(name, name) if isinstance(name, str) else name


class UnknownOptionError(ConfigError, TypeError):
    """An option ``LLM`` does not take. vLLM's LLM raises a TypeError for one (EngineArgs' unexpected keyword
    argument): code written for it that catches TypeError let this ValueError through. Both, so neither misses it."""


@dataclass(frozen=True, kw_only=True)
class EngineOptions(EngineConfig):
    model: str = option("qwen3-0.6b", "shipped model config name or HF model dir")
    device: str = option("auto", "cuda, cuda:N or cpu (auto: cuda when available)")
    dtype: str = option("auto", "weights and activations (auto: bfloat16 on CUDA, float32 on CPU; half and float "
                        "as vLLM spells float16 and float32)", choices=DTYPES, parse=canonical_dtype)
    load_format: str = option("auto", "weights: the model dir's safetensors, or random", choices=LOAD_FORMATS)
    enforce_eager: bool = option(False, "no CUDA graphs")
    run_ahead: bool = option(True, "launch no step before the one before it is postprocessed (by default, on one "
                             "device, the next decode step of the same batch is launched while the host postprocesses "
                             "and schedules this one; a step whose batch turns out otherwise is computed again)",
                             flag="--no-run-ahead")
    attention_backend: str = option("auto", "attention kernels", choices=ATTENTION_BACKENDS)
    overlap_decode_attention: bool = option(False, "run a mixed step's decode attention on a second CUDA stream "
                                            "beside its prefill attention (the triton backend; the same outputs, "
                                            "serving capacity 2-7 percent higher on an H100). Off by default while "
                                            "the shipped profiles are measured without it")
    max_cuda_graph_batch_size: int = option(512, "largest decode batch captured as a CUDA graph")
    max_cuda_graph_tokens: int = option(8192, "largest prefill or mixed step (batched tokens) replayed as piecewise "
                                        "CUDA graphs, attention eager between them; 0: such steps run eagerly")
    distributed_backend: str = option("auto", "tensor-parallel collectives (auto: nccl on CUDA, gloo on CPU)",
                                      choices=DISTRIBUTED_BACKENDS)

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: object) -> EngineOptions:
        known = {f.name for f in fields(cls)} - {"model"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise UnknownOptionError(None, f"unknown option(s) {', '.join(unknown)}; supported: "
                                           f"{', '.join(sorted(known))}")
        dtype = kwargs.get("dtype")
        if type(dtype).__name__ == "dtype" and type(dtype).__module__ == "torch":  # torch.bfloat16 as vLLM takes it
            kwargs["dtype"] = str(dtype).removeprefix("torch.")
        return cls(model=model, **kwargs)

    def __post_init__(self) -> None:
        self._plain_ints(("max_cuda_graph_batch_size", "max_cuda_graph_tokens"))
        self._plain_scalars(("enforce_eager", "run_ahead", "overlap_decode_attention"))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))  # "half" as float16, however the options came
        super().__post_init__()
        # An empty --model was read as the current folder: "model directory . has no config.json".
        check(isinstance(self.model, str) and self.model.strip() != "",
              f"model is empty; expected a shipped model config name or a Hugging Face model folder, got "
              f"{self.model!r}",
              "model")
        check(isinstance(self.device, str)
              and (self.device in ("auto", "cuda", "cpu") or _cuda_index(self.device) is not None),
              f"device must be 'auto', 'cuda', 'cuda:N' (N an integer from 0 to {MAX_CUDA_INDEX}) or 'cpu', got "
              f"{self.device!r}", "device")
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("load_format", self.load_format, LOAD_FORMATS)
        check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        check_choice("distributed_backend", self.distributed_backend, DISTRIBUTED_BACKENDS)
        if self.device == "cpu":  # 'auto' is checked once resolved (check_device_type), where torch is loaded
            self.check_device_type("cpu")
        # "no" (any string, any number) was taken as true without a word: CUDA graphs off where they were asked for.
        for name in ("enforce_eager", "run_ahead", "overlap_decode_attention"):
            check(isinstance(getattr(self, name), bool), f"{name} must be true or false, got {getattr(self, name)!r}",
                  name)
        # The second stream is the triton backend's (TritonBackend.overlap_decode): elsewhere it would do nothing.
        check(not self.overlap_decode_attention or self.attention_backend in ("auto", "triton"),
              f"overlap_decode_attention needs attention_backend 'triton' (or 'auto' on a CUDA device), got "
              f"{self.attention_backend!r}", "overlap_decode_attention")
        check_int("max_cuda_graph_batch_size", self.max_cuda_graph_batch_size)
        check_int("max_cuda_graph_tokens", self.max_cuda_graph_tokens, minimum=0)
        # The runner hands token offsets, sequence lengths and rows to its kernels as int32 (the simulator, which has
        # none, takes larger values): --max-model-len 10**20 was an OverflowError traceback while building the model.
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            check(value is None or value < INT32_LIMIT,
                  f"{name} must be below 2**31 (token offsets and lengths are int32 in the engine), got {value}", name)

    def check_device_type(self, device_type: str) -> None:
        """Refuse options the device the engine runs on cannot take (``device``, or what 'auto' resolved to). NCCL on
        the CPU failed only once tensor-parallel workers had started (init_process_group's device_id error, naming
        no option), and with one process it was silently ignored."""
        if device_type == "cuda":
            return
        device = (f"device={self.device!r}" if self.device != "auto"
                  else f"device='auto' is {device_type} here (torch sees no CUDA device)")
        if self.distributed_backend == "nccl":
            check(False, f"distributed_backend 'nccl' needs a CUDA device, and {device}; use 'gloo' (or 'auto') on "
                         f"{device_type}", "distributed_backend")
        # Refused by the attention module only once the engine process had loaded torch: engine.serve then named
        # --model ("--model M: ValueError: attention backend 'triton' needs a CUDA device").
        if self.attention_backend in CUDA_ATTENTION_BACKENDS:
            check(False, f"attention_backend {self.attention_backend!r} needs a CUDA device, and {device}; use "
                         f"'torch' (or 'auto') on {device_type}", "attention_backend")
        check(not self.overlap_decode_attention, f"overlap_decode_attention needs a CUDA device, and {device}",
              "overlap_decode_attention")


def cuda_device_problem(device: str, cuda) -> str | None:
    """Why ``device`` ('cuda' or 'cuda:N') cannot run where ``cuda`` (torch.cuda, passed in: this module imports no
    torch) sees the devices it sees, or None. The runner's check, and the one engine.replay and engine.serve make before
    the model loads (engine.serve's engine process had blamed --model for it)."""
    num_devices = cuda.device_count() if cuda.is_available() else 0
    index = 0 if device == "cuda" else _cuda_index(device)
    if index is not None and index < num_devices:
        return None
    seen = "no CUDA device" if num_devices == 0 else f"{num_devices} CUDA device(s), cuda:0 to cuda:{num_devices - 1}"
    return f"device={device!r} was asked for but torch sees {seen}"


def _cuda_index(device: str) -> int | None:
    """N of a well-formed 'cuda:N' that torch can hold; None for anything else."""
    match = CUDA_DEVICE.fullmatch(device)
    if match is None or int(match.group(1)) > MAX_CUDA_INDEX:
        return None
    return int(match.group(1))


def script_options_or_exit(parser, model: str, **kwargs):
    """For a benchmark or validation script, before torch is imported: ``(EngineOptions.from_kwargs(model, **kwargs),
    the model's ModelShape)``, or exit 2 with one line naming the option (``--block-size: ...``, ``--model NAME:
    ...``, a --max-model-len beyond the model's positions): each was a traceback after the model was built."""
    from engine.core.model_config import ModelShape

    try:
        options = EngineOptions.from_kwargs(model, **kwargs)
    except ConfigError as exc:  # names its field: --block-size 3 is "block_size must be a power of two ..."
        flag = f"--{exc.field.replace('_', '-')}: " if exc.field else ""
        parser.exit(2, f"error: {flag}{exc}\n")
    try:
        shape = ModelShape.load(model)
    except (OSError, ValueError) as exc:  # FileNotFoundError for an unknown name; ValueError for a bad config.json
        parser.exit(2, f"error: --model {model}: {exc}\n")
    if options.max_model_len > shape.max_position_embeddings:
        parser.exit(2, f"error: --max-model-len {options.max_model_len} is more than {shape.name}'s "
                       f"max_position_embeddings; expected <= {shape.max_position_embeddings}\n")
    return options, shape
