"""Model definitions. One decoder covers Qwen3, Qwen2 and Llama: they differ in q/k/v biases and q/k norms."""

from engine.gpu.models.decoder import DecoderForCausalLM

__all__ = ["DecoderForCausalLM"]
