"""One module per architecture family, chosen by `general.architecture`."""

from __future__ import annotations

from types import ModuleType

from ...errors import UnsupportedArchitecture
from . import bert, gemma2, gemma3, gemma_embedding, gptoss, llama, nomic_bert, phi3, qwen2, qwen3, qwen3moe

ARCHITECTURES: dict[str, ModuleType] = {
    "llama": llama,  # also Mistral 7B-type files and SmolLM2, which carry arch "llama"
    "qwen2": qwen2,
    "qwen3": qwen3,
    "qwen3moe": qwen3moe,
    "phi3": phi3,
    "gemma2": gemma2,
    "gemma3": gemma3,
    "gpt-oss": gptoss,  # llama.cpp's name for OpenAI's gpt-oss
    "gptoss": gptoss,  # Ollama's name for the same family; metadata keys carry whichever prefix the file uses
    "bert": bert,  # an encoder (ENCODER): embeddings only, run by engine.encoder
    "nomic-bert": nomic_bert,  # an encoder too: nomic-embed-text v1 / v1.5 (rope, SwiGLU)
    "gemma-embedding": gemma_embedding,  # an encoder: EmbeddingGemma (gemma3's body, symmetric sliding windows)
}


def get(arch: str) -> ModuleType:
    try:
        return ARCHITECTURES[arch]
    except KeyError:
        raise UnsupportedArchitecture(arch) from None
