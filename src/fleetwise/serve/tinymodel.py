"""A tiny randomly initialised Llama model as GGUF: a real inference server with no downloaded weights.

``write_tiny_gguf(path, seed)`` writes a ~0.6 MB Llama model (the ``gguf`` package, the ``backend`` extra) that
llama.cpp loads and serves (``python -m llama_cpp.server --model PATH``). It says nothing sensible, but it is a
real model run by a real OpenAI-compatible server: tokenizer, prefill, decode, sampling, streaming. Used by the
gateway tests and its overhead benchmark (docs/serve.md).

- Vocabulary: ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens ``<0x00>``..``<0xFF>`` (SentencePiece byte
  fallback), the printable ASCII characters with and without the word-start mark ``▁``, and a few words.
- EOS (and every other control or byte token) cannot be sampled: the residual stream carries a constant
  positive component in dimension 0 that no layer writes to, and the output rows of those tokens read
  -1000 x that component, so their logits are about -8000. Completions therefore always run to ``max_tokens``
  and are printable ASCII.
- The same seed gives a byte-identical file.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import numpy as np

__all__ = ["write_tiny_gguf", "TINY_CHAT_TEMPLATE"]

# a minimal chat template (Jinja, as llama.cpp / llama-cpp-python read it from the GGUF metadata)
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORDS = ["the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "token", "fleet",
          "route", "batch", "cache", "prompt"]

# gguf token types (gguf.TokenType), spelled out so that this module imports without gguf
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def _vocab() -> tuple[list[str], list[float], list[int]]:
    toks: list[str] = ["<unk>", "<s>", "</s>"]
    types = [_UNKNOWN, _CONTROL, _CONTROL]
    toks += [f"<0x{b:02X}>" for b in range(256)]
    types += [_BYTE] * 256
    printable = [c for c in string.printable if c not in string.whitespace]  # 94 characters
    pieces = ["\u2581"] + printable + ["\u2581" + c for c in printable] + ["\u2581" + w for w in _WORDS]
    toks += pieces
    types += [_NORMAL] * len(pieces)
    # SentencePiece scores: longer pieces first, so that words merge; specials and bytes score 0
    scores = [0.0] * (3 + 256) + [float(len(p)) - i * 1e-3 for i, p in enumerate(pieces)]
    return toks, scores, types


def write_tiny_gguf(path: str | os.PathLike[str], seed: int = 0, *, n_embd: int = 64, n_layer: int = 2,
                    n_head: int = 4, n_ff: int = 128, context_length: int = 2048) -> Path:
    """Write a tiny random Llama GGUF to ``path`` and return the path. Deterministic in ``seed``."""
    try:
        import gguf
    except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            "write_tiny_gguf needs the gguf package: pip install -c constraints.txt 'fleetwise[backend]'",
            name=e.name) from None
    if n_embd % n_head:
        raise ValueError(f"n_embd {n_embd} is not a multiple of n_head {n_head}")
    path = Path(path)
    toks, scores, types = _vocab()
    n_vocab = len(toks)
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"fleetwise-tiny-llama-seed{seed}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)  # must equal the head size ("invalid n_rot" otherwise)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template(TINY_CHAT_TEMPLATE)

    # numpy shapes are (out, in): ggml's ne is the reverse
    emb = rand(n_vocab, n_embd, scale=0.1)
    emb[:, 0] = 1.0  # the constant component: every token puts 1.0 in dimension 0
    w.add_tensor("token_embd.weight", emb)
    for b in range(n_layer):
        w.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(f"blk.{b}.attn_q.weight", rand(n_embd, n_embd, scale=0.2))
        w.add_tensor(f"blk.{b}.attn_k.weight", rand(n_embd, n_embd, scale=0.2))
        w.add_tensor(f"blk.{b}.attn_v.weight", rand(n_embd, n_embd, scale=0.2))
        wo = rand(n_embd, n_embd, scale=0.1)
        wo[0, :] = 0.0  # never writes to dimension 0
        w.add_tensor(f"blk.{b}.attn_output.weight", wo)
        w.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(f"blk.{b}.ffn_gate.weight", rand(n_ff, n_embd, scale=0.2))
        w.add_tensor(f"blk.{b}.ffn_up.weight", rand(n_ff, n_embd, scale=0.2))
        down = rand(n_embd, n_ff, scale=0.1)
        down[0, :] = 0.0
        w.add_tensor(f"blk.{b}.ffn_down.weight", down)
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    out = rand(n_vocab, n_embd, scale=1.0)
    out[:, 0] = 0.0  # the constant component favours no normal token
    banned = [i for i, t in enumerate(types) if t != _NORMAL]
    out[banned, :] = 0.0
    out[banned, 0] = -1000.0  # logit = -1000 x (a positive number around sqrt(n_embd))
    w.add_tensor("output.weight", out)

    path.parent.mkdir(parents=True, exist_ok=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
