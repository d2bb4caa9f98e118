"""Weights: HF safetensors (fused and sharded through each parameter's weight_loader) or dummy random values."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def _default_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded)


def load_safetensors(model: nn.Module, model_dir: Path) -> None:
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir} (use load_format='dummy' for random weights)")
    params = dict(model.named_parameters(remove_duplicate=False))
    packed = getattr(model, "packed_modules", {})
    loaded_names: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                if "rotary_emb.inv_freq" in name:
                    continue
                target, shard_id = name, None
                for fragment, (fused, shard) in packed.items():
                    if f".{fragment}." in name:
                        target, shard_id = name.replace(f".{fragment}.", f".{fused}."), shard
                        break
                param = params.get(target)
                if param is None:
                    if name == "lm_head.weight" and getattr(model, "shape", None) and model.shape.tie_word_embeddings:
                        continue
                    raise ValueError(f"{file.name}: checkpoint tensor {name!r} matches no model parameter")
                loader = getattr(param, "weight_loader", _default_loader)
                tensor = f.get_tensor(name)
                if shard_id is None:
                    loader(param, tensor)
                else:
                    loader(param, tensor, shard_id)
                loaded_names.add(target)
    missing = [n for n in params if n not in loaded_names
               and not (n == "lm_head.weight" and "model.embed_tokens.weight" in loaded_names)]
    if missing:
        raise ValueError(f"{model_dir}: checkpoint lacks {len(missing)} parameters, e.g. {missing[:3]}")


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
