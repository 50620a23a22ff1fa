"""Data and model of the LoRA example: generated token sequences, a small transformer with LoRA adapters.

Model. A pre-norm transformer encoder (token and position ``nn.Embedding``, ``blocks`` blocks of multi-head
self-attention and a 4d MLP, final LayerNorm, mean pooling, a linear head over 10 classes). Attention is built
from ``nn.Linear`` projections (``nn.MultiheadAttention`` keeps its projections as parameters of its own,
which the fused DP-SGD step cannot clip). Every Linear -- q, k, v, o, both MLP layers and the head -- is a
``client_mods.dp_sgd_fused.LoRALinear``: ``base(x) + (alpha/r) B(A(x))``.

What is trained, what is sent. The base model stands in for a pretrained checkpoint that every party
loads locally: here it is generated from the public ``base-seed`` (nothing to download), and so are the
adapters' A matrices. FFA-LoRA (Sun et al. 2024, "Improving LoRA in privacy-preserving federated
learning") freezes A at that random initialisation and trains B only (zero at the start, so the first model
is the base). Frozen tensors are kept as non-persistent buffers (:func:`freeze`), not parameters: they are
outside ``state_dict()``, so the ArrayRecord the server sends and the clients return holds the B matrices
and nothing else, the DP-SGD step clips and noises B only, and the server's central clipping and noise see
the adapters only. With A frozen and shared, the server's mean of the clients' B matrices gives exactly
the mean of their products BA (averaging A and B separately would not: mean(B)mean(A) != mean(BA)).
``freeze-a = false`` trains and sends A too (plain LoRA, for comparison).

Data (nothing is downloaded). Each class c has a public "topic": ``vocab // 20`` token ids drawn from
``data-seed``. A sequence of class c takes each of its tokens from the class's topic with probability
``signal``, else uniformly from the vocabulary. Clients draw their own sequences from their own seed; the
server's test set from another.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from client_mods.dp_sgd_fused import LoRALinear

NUM_CLASSES = 10
#: name -> (vocabulary, sequence length, d_model, heads, blocks, LoRA rank)
SIZES: dict[str, tuple[int, int, int, int, int, int]] = {
    "full": (1000, 64, 256, 4, 4, 8),
    "reduced": (64, 8, 16, 2, 2, 2),
}


def size_of(size: str) -> tuple[int, int, int, int, int, int]:
    """(vocab, seq, d, heads, blocks, rank) of a named size; ValueError for an unknown one."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return SIZES[size]


class Attention(nn.Module):
    """Multi-head self-attention from four LoRA-adapted Linear projections."""

    def __init__(self, d: int, heads: int, rank: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (LoRALinear(nn.Linear(d, d), rank) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape

        def split(h: torch.Tensor) -> torch.Tensor:
            return h.view(n, t, self.heads, d // self.heads).transpose(1, 2)

        out = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.o(out.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    """Pre-norm block: x + attn(LN(x)), then x + MLP(LN(x)) with a 4d GELU MLP of LoRA-adapted Linears."""

    def __init__(self, d: int, heads: int, rank: int) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads, rank)
        self.ln2 = nn.LayerNorm(d)
        self.fc1, self.fc2 = LoRALinear(nn.Linear(d, 4 * d), rank), LoRALinear(nn.Linear(4 * d, d), rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class LoRATransformer(nn.Module):
    """Embeddings, ``blocks`` pre-norm blocks, final LayerNorm, mean pooling, LoRA-adapted linear head."""

    def __init__(self, vocab: int, seq: int, d: int, heads: int, blocks: int, rank: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, rank) for _ in range(blocks))
        self.ln_f, self.head = nn.LayerNorm(d), LoRALinear(nn.Linear(d, NUM_CLASSES), rank)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids).contiguous()
        h = self.tok(ids) + self.pos(positions)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h).mean(1))


def freeze(model: nn.Module, freeze_a: bool = True) -> nn.Module:
    """Turn every parameter but the adapters' B (and A unless ``freeze_a``) into a non-persistent buffer:
    frozen, outside ``state_dict()`` (never sent), still moved by ``.to(device)``."""
    keep = set()
    for module in model.modules():
        if isinstance(module, LoRALinear):
            keep.add(id(module.lora_B))
            if not freeze_a:
                keep.add(id(module.lora_A))
    for module in model.modules():
        if id(module) in keep:
            continue
        for name, param in list(module.named_parameters(recurse=False)):
            delattr(module, name)
            module.register_buffer(name, param.detach(), persistent=False)
    return model


def build_model(size: str = "full", base_seed: int = 0, freeze_a: bool = True) -> nn.Module:
    """The transformer of ``size``: base and A from the public ``base_seed`` (the same for every party), B = 0."""
    vocab, seq, d, heads, blocks, rank = size_of(size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(base_seed))
        model = LoRATransformer(vocab, seq, d, heads, blocks, rank)
    return freeze(model, freeze_a)


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Trainable (= sent) parameters and the frozen ones (base weights, and A when frozen)."""
    trainable = sum(p.numel() for p in model.parameters())
    frozen = sum(b.numel() for name, b in model.named_buffers())
    return {"trainable": trainable, "frozen": frozen, "total": trainable + frozen}


def topics(vocab: int, data_seed: int) -> torch.Tensor:
    """(10, vocab // 20): each class's topic tokens, public."""
    gen = torch.Generator().manual_seed(int(data_seed))
    width = max(1, vocab // 20)
    return torch.stack([torch.randperm(vocab, generator=gen)[:width] for _ in range(NUM_CLASSES)])


def generate(count: int, size: str, signal: float, data_seed: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` sequences (int64 token ids N x seq, int64 labels) from stream ``stream``."""
    vocab, seq = size_of(size)[:2]
    table = topics(vocab, data_seed)
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([int(data_seed), int(stream)]).generate_state(1)[0]))
    labels = torch.randint(0, NUM_CLASSES, (count,), generator=gen)
    uniform = torch.randint(0, vocab, (count, seq), generator=gen)
    pick = torch.randint(0, table.shape[1], (count, seq), generator=gen)
    on_topic = torch.rand(count, seq, generator=gen) < signal
    ids = torch.where(on_topic, table[labels][torch.arange(count)[:, None], pick], uniform)
    return ids.numpy().astype(np.int64), labels.numpy().astype(np.int64)


TEST_STREAM = 1_000_000


def load_partition(partition_id: int, size: str, count: int, signal: float, data_seed: int):
    """Client ``partition_id``'s own sequences."""
    return generate(count, size, signal, data_seed, partition_id)


def load_test(size: str, count: int, signal: float, data_seed: int):
    """The server's test set (central evaluation)."""
    return generate(count, size, signal, data_seed, TEST_STREAM)
