"""Weights: HF safetensors (fused and sharded through each parameter's weight_loader) or dummy random values."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from engine.core.json_errors import json_type_name
from engine.core.messages import one_line
from engine.core.model_config import ModelShape, read_model_json


def _default_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded)


INDEX_NAME = "model.safetensors.index.json"


def _checkpoint_files(model_dir: Path) -> list[Path]:
    """The *.safetensors files to load: those model.safetensors.index.json maps tensors to where it is there, as vLLM
    does. Every file in the folder was loaded, so a stale one beside the shards (a model.safetensors of an earlier
    save) overwrote the tensors it shares with them, whichever file sorted last, without a word."""
    index = Path(model_dir) / INDEX_NAME
    if not index.is_file():
        return sorted(Path(model_dir).glob("*.safetensors"))
    content = read_model_json(index)
    if not isinstance(content, dict):
        raise ValueError(f"{index}: top level is a JSON {json_type_name(content)}; expected an object")
    weight_map = content.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(f, str) for f in weight_map.values()):
        raise ValueError(f"{index}: 'weight_map' is {one_line(repr(weight_map), 60)}; expected an object mapping "
                         "tensor names to the *.safetensors files that hold them")
    files = sorted({Path(model_dir) / name for name in weight_map.values()})
    missing = next((f for f in files if not f.is_file()), None)
    if missing is not None:
        raise FileNotFoundError(f"{index}: maps tensors to {missing.name}, which is not in {model_dir} (a shard "
                                "missing from the download?)")
    return files


def load_safetensors(model: nn.Module, model_dir: Path) -> None:
    files = _checkpoint_files(model_dir)
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir} (use load_format='dummy' for random weights)")
    params = dict(model.named_parameters(remove_duplicate=False))
    packed = getattr(model, "packed_modules", {})
    shape = getattr(model, "shape", None)
    tied = shape is not None and shape.tie_word_embeddings
    loaded_names: set[str] = set()
    file_of: dict[str, Path] = {}
    for file in files:
        with _open(file) as f:
            for name in f.keys():
                if "rotary_emb.inv_freq" in name:
                    continue
                if name in file_of:  # which copy counted was the order of the file names
                    raise ValueError(f"{file}: checkpoint tensor {name!r} is in {file_of[name].name} too; expected "
                                     f"each tensor in one file (a stale file beside the shards? {INDEX_NAME} names "
                                     "the files to load)")
                file_of[name] = file
                # A tied model's LM head is its embedding (one parameter): a checkpoint's lm_head.weight, where it has
                # one, is skipped, as vLLM does. It was loaded into that shared parameter, so whichever of the two came
                # last was both the embedding and the head: lm_head's, from a shard after the embedding's.
                if name == "lm_head.weight" and tied:
                    continue
                target, shard_id = name, None
                for fragment, (fused, shard) in packed.items():
                    if f".{fragment}." in name:
                        target, shard_id = name.replace(f".{fragment}.", f".{fused}."), shard
                        break
                param = params.get(target)
                if param is None:
                    raise ValueError(f"{file}: checkpoint tensor {name!r} matches no model parameter")
                tensor = _read(f, file, name)
                _check_tensor(file, name, tensor, shape)
                loader = getattr(param, "weight_loader", _default_loader)
                try:
                    if shard_id is None:
                        loader(param, tensor)
                    else:
                        loader(param, tensor, shard_id)
                except (RuntimeError, ValueError) as exc:  # a shape no check above foresaw: name the tensor
                    raise ValueError(f"{file}: checkpoint tensor {name!r} of shape {tuple(tensor.shape)} does not "
                                     f"load: {exc}") from None
                loaded_names.add(name)
    if tied and "lm_head.weight" in file_of and "model.embed_tokens.weight" in file_of:
        _check_tied_head(file_of["lm_head.weight"], file_of["model.embed_tokens.weight"])
    # The LM head is the embedding's only when tie_word_embeddings says so: an untied model's missing lm_head.weight
    # was passed over, and every logit came from an uninitialised matrix (all tokens 0), without a word.
    # Counted by checkpoint tensor, not by parameter: a fused parameter (qkv_proj, gate_up_proj) counted as loaded once
    # any of its parts was, and a checkpoint without k_proj or up_proj ran on the uninitialised rest, without a word.
    missing = [n for param in params for n in _checkpoint_names(param, packed) if n not in loaded_names
               and not (n == "lm_head.weight" and tied and "model.embed_tokens.weight" in loaded_names)]
    if missing:
        untied = " (config.json's tie_word_embeddings is false)" if "lm_head.weight" in missing and not tied else ""
        raise ValueError(f"{model_dir}: checkpoint lacks {len(missing)} parameters, e.g. {missing[:3]}{untied}")


def _check_tied_head(head_file: Path, embed_file: Path) -> None:
    """A tied model's checkpoint may carry its head as a copy of the embedding; one that differs is an untied head
    under a config.json that says tied. vLLM runs it on the embedding, transformers 5 unties it and runs it on
    lm_head.weight: the engine gave other tokens than transformers, without a word."""
    with _open(head_file) as f:
        head = _read(f, head_file, "lm_head.weight")
    with _open(embed_file) as f:
        embed = _read(f, embed_file, "model.embed_tokens.weight")
    if head.shape != embed.shape or not torch.equal(head, embed.to(head.dtype)):
        raise ValueError(f"{head_file}: checkpoint tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' "
                         "while config.json's 'tie_word_embeddings' is true; expected false for a head of its own "
                         "(transformers then uses lm_head.weight, vLLM the embedding)")


def _checkpoint_names(param: str, packed: dict[str, tuple[str, object]]) -> list[str]:
    """The HF checkpoint tensors that fill the parameter ``param``: one, or each part of a fused one."""
    parts = [fragment for fragment, (fused, _) in packed.items() if f".{fused}." in param]
    if not parts:
        return [param]
    fused = packed[parts[0]][0]
    return [param.replace(f".{fused}.", f".{fragment}.") for fragment in parts]


def _open(file: Path):
    """A truncated or foreign file was safetensors' "Error while deserializing header: header too large" under the
    model folder's name, not the file's (a sharded checkpoint has many)."""
    from safetensors import safe_open

    # A FIFO named *.safetensors blocked the load forever (safe_open waits for a writer); a folder so named was
    # "No such device (os error 19)".
    if not file.is_file():
        why = ("does not exist (a broken link?)" if not file.exists()
               else "is not a regular file (a folder, FIFO or device)")
        raise ValueError(f"{file}: {why}; expected a safetensors file")
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: the file is not one to read
        raise ValueError(f"{file}: not a readable safetensors file ({one_line(exc)})") from None


def _read(f, file: Path, name: str) -> torch.Tensor:
    try:
        return f.get_tensor(name)
    except Exception as exc:  # noqa: BLE001 - a tensor whose bytes are cut short or of a dtype torch lacks
        raise ValueError(f"{file}: checkpoint tensor {name!r} cannot be read ({one_line(exc)})") from None


def _expected_shape(shape: ModelShape, name: str) -> tuple[int, ...] | None:
    """The shape config.json's sizes give the HF tensor ``name`` (None: not one of a decoder's)."""
    parts = name.split(".")
    if len(parts) < 2:
        return None
    module, kind = parts[-2], parts[-1]
    hidden, inter = shape.hidden_size, shape.intermediate_size
    matrices = {
        "embed_tokens": (shape.vocab_size, hidden), "lm_head": (shape.vocab_size, hidden),
        "q_proj": (shape.q_size, hidden), "k_proj": (shape.kv_size, hidden), "v_proj": (shape.kv_size, hidden),
        "o_proj": (hidden, shape.q_size), "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }
    vectors = {"input_layernorm": hidden, "post_attention_layernorm": hidden, "norm": hidden,
               "q_norm": shape.head_dim, "k_norm": shape.head_dim}
    if module in matrices:
        return matrices[module] if kind == "weight" else (matrices[module][0],) if kind == "bias" else None
    if module in vectors and kind == "weight":
        return (vectors[module],)
    return None


def _check_tensor(file: Path, name: str, tensor: torch.Tensor, shape: ModelShape | None) -> None:
    """A checkpoint tensor of another shape than config.json gives was cut to fit by the sharded loaders (a larger
    intermediate_size or vocabulary: other tokens, without a word) or failed inside torch ("start (0) + length (64)
    exceeds dimension size (32)"), naming neither the tensor nor the file; an integer tensor (a quantized checkpoint)
    was converted to floats as if it held weights."""
    if not tensor.dtype.is_floating_point:
        raise ValueError(f"{file}: checkpoint tensor {name!r} is {str(tensor.dtype).removeprefix('torch.')}; expected "
                         "floating-point weights (quantized checkpoints are not supported)")
    expected = None if shape is None else _expected_shape(shape, name)
    if expected is not None and tuple(tensor.shape) != expected:
        raise ValueError(f"{file}: checkpoint tensor {name!r} has shape {tuple(tensor.shape)}; the sizes in "
                         f"config.json give {expected}")


@torch.no_grad()
def init_dummy(model: nn.Module, seed: int = 0) -> None:
    """Random weights with the right scale (std 0.02, norms at one), for benchmarks without a checkpoint."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            # Drawn where the parameter lives: an 8B model's worth of normals on the host would take minutes.
            generator = generators.get(param.device)
            if generator is None:
                generator = generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
            param.normal_(0.0, 0.02, generator=generator)
