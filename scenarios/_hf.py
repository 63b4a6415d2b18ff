"""Tiny Hugging Face models for the ``hf_`` scenarios: built from a config with random
weights (no download, nothing from a hub), shapes small and uneven.

transformers is an optional extra (``pip install 'fsdp-compat[hf]'``): it is imported
inside the builders, so the library loads without it and the cells are skipped with the
reason (``Scenario.requires``).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from harness.spec import Ctx, Optim

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: the modeling modules the builders below use (imported once per worker, before any cell)
REQUIRES = ("transformers.models.llama.modeling_llama", "transformers.models.llava.modeling_llava",
            "transformers.models.clip.modeling_clip", "transformers.models.mixtral.modeling_mixtral")
#: for batches of repeated tokens: attention over identical positions leaves q/k grads at
#: rounding-noise level, which AdamW (dividing by sqrt(v) + 1e-8) turns into parameter
#: differences of ~1e-4 between equally correct runs; SGD with momentum keeps them tiny
SGD = Optim(kind="sgd", lr=0.05)
SEQ, ROWS = 8, 2

LLAMA = dict(vocab_size=97, hidden_size=40, intermediate_size=54, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True, rms_norm_eps=1e-5)
LLAMA_UNITS = ("model.layers.0", "model.layers.1")

LLAVA_TEXT = dict(model_type="llama", vocab_size=101, hidden_size=32, intermediate_size=44, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False)
LLAVA_VISION = dict(model_type="clip_vision_model", hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                    num_attention_heads=2, image_size=16, patch_size=8, num_channels=3, projection_dim=24)
#: 4 image tokens per image ((16 / 8) ** 2 patches; the CLS token is dropped)
LLAVA = dict(image_token_index=100, image_seq_length=4, projector_hidden_act="gelu",
             vision_feature_select_strategy="default", vision_feature_layer=-1)
#: the vision tower's encoder layers are units of their own (a unit on the whole tower trips
#: transformers 5's output capture, which keys on the class fully_shard replaces)
LLAVA_UNITS = ("model.vision_tower.encoder.layers.0", "model.vision_tower.encoder.layers.1",
               "model.multi_modal_projector", "model.language_model.layers.0", "model.language_model.layers.1")

MIXTRAL = dict(vocab_size=83, hidden_size=32, intermediate_size=36, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=1,
               tie_word_embeddings=False)


def llama(**over) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**{**LLAMA, **over}, attn_implementation="eager"))


def llava() -> nn.Module:
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    return LlavaForConditionalGeneration(LlavaConfig(vision_config=dict(LLAVA_VISION), text_config=dict(LLAVA_TEXT),
                                                     **LLAVA, attn_implementation="eager"))


def mixtral() -> nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(MixtralConfig(**MIXTRAL, attn_implementation="eager"))


def lm_loss(model: nn.Module, batch: dict, ctx: Ctx) -> torch.Tensor:
    """The model's own causal-LM loss (no KV cache: this is training)."""
    return model(**batch, use_cache=False).loss


def text_batch(vocab: int):
    """Random token rows (the harness seeds the RNG per rank, step and micro-batch)."""
    def batch(ctx: Ctx) -> dict:
        ids = torch.randint(0, vocab, (ROWS, SEQ))
        return {"input_ids": ids, "labels": ids.clone()}

    return batch


def rows_of(tokens_for_rank):
    """Rows that repeat one token each: top-1 routing then sends a whole row to one expert."""
    def batch(ctx: Ctx) -> dict:
        ids = torch.tensor([[t] * SEQ for t in tokens_for_rank(ctx)])
        return {"input_ids": ids, "labels": ids.clone()}

    return batch


def llava_batch(with_image):
    """LLaVA rows: text only (ids below the image token), or 4 image tokens + text with pixels."""
    def batch(ctx: Ctx) -> dict:
        token = LLAVA["image_token_index"]
        if not with_image(ctx):
            ids = torch.randint(0, token, (ROWS, SEQ))
            return {"input_ids": ids, "labels": ids.clone()}
        n = LLAVA["image_seq_length"]
        ids = torch.cat([torch.full((ROWS, n), token), torch.randint(0, token, (ROWS, SEQ - n))], dim=1)
        labels = ids.clone()
        labels[:, :n] = -100
        side = LLAVA_VISION["image_size"]
        return {"input_ids": ids, "labels": labels, "pixel_values": torch.randn(ROWS, 3, side, side)}

    return batch


# --------------------------------------------------------------------------- MoE with per-expert modules


class ExpertMLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Top1MoE(nn.Module):
    """A top-1 router over a list of expert MLPs, the layout of many training stacks (and of
    transformers before 5): an expert that gets no token on a rank runs no forward there."""

    def __init__(self, hidden: int, inter: int, experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(ExpertMLP(hidden, inter) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, x.shape[-1])
        probs = self.router(h).softmax(-1)
        top_p, top_i = probs.max(-1)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            idx = (top_i == e).nonzero(as_tuple=True)[0]
            if idx.numel():
                out = out.index_add(0, idx, expert(h[idx]) * top_p[idx, None])
        return out.reshape(x.shape)


def llama_moe(experts: int = 4, inter: int = 20) -> nn.Module:
    """The tiny Llama with each decoder MLP replaced by a ``Top1MoE`` (weights N(0, 0.02),
    from a generator of their own so the routing below is fixed)."""
    model = llama()
    g = torch.Generator().manual_seed(1000)
    for layer in model.model.layers:
        moe = Top1MoE(model.config.hidden_size, inter, experts)
        with torch.no_grad():
            for p in moe.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        layer.mlp = moe
    return model


#: with these weights, a row of one repeated token is routed (layer 0, layer 1) as:
#: 2 -> (0, 0), 52 -> (1, 1), 6 -> (2, 0), 9 -> (2, 1)
MOE_TOKENS = {"even": (2, 52), "odd": (6, 9)}
