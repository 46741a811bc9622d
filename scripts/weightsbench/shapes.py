"""The state_dicts the weights benchmark shares: Llama-3-8B's 291 tensors and a 19,000-tensor mixture of experts,
filled with random bf16, and their exact checksums."""

from __future__ import annotations

from typing import Any


def llama8b_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """Llama-3-8B's 291 tensors (hidden 4096, 32 layers, 8 KV heads, MLP 14336, vocabulary 128256)."""
    h, kv, mlp, vocab, layers = 4096, 1024, 14336, 128256, 32
    out = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (mlp, h)),
            (p + "mlp.up_proj.weight", (mlp, h)),
            (p + "mlp.down_proj.weight", (h, mlp)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return out


def moe_shapes(expert_mlp: int = 256) -> list[tuple[str, tuple[int, ...]]]:
    """A Qwen3-30B-A3B-like MoE: 48 layers x 128 experts x 3 matrices (hidden 2048; the experts' MLP width scaled to
    `expert_mlp` so that two generations and the baselines fit on one GPU), attention, norms, the router."""
    h, q, kv, experts, layers, vocab = 2048, 4096, 512, 128, 48, 151936
    out = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate.weight", (experts, h)),
        ]
        for e in range(experts):
            pe = f"{p}mlp.experts.{e}."
            out += [
                (pe + "gate_proj.weight", (expert_mlp, h)),
                (pe + "up_proj.weight", (expert_mlp, h)),
                (pe + "down_proj.weight", (h, expert_mlp)),
            ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return out


def shapes_of(name: str, quick: bool) -> list[tuple[str, tuple[int, ...]]]:
    shapes = llama8b_shapes() if name == "llama8b" else moe_shapes()
    if quick:  # the same tensor count, each at most 1 Mi elements: a fast check of the script itself
        shapes = [(n, tuple(min(d, 1024) for d in s)) for n, s in shapes]
    return shapes


def checksums(sd: dict[str, Any]) -> dict[str, int]:
    import torch

    out = {}
    names = list(sd)
    # One .item() per tensor is slow for 19,000 tensors: stack the sums and copy once.
    for i in range(0, len(names), 4096):
        chunk = names[i : i + 4096]
        sums = []
        for n in chunk:
            flat = sd[n].contiguous().view(-1)
            bits = flat.view(torch.int16) if flat.element_size() == 2 else flat.view(torch.int32)
            sums.append(bits.sum(dtype=torch.int64))
        values = torch.stack(sums).tolist()
        out.update(zip(chunk, values))
    return out


def random_state_dict(shapes: list[tuple[str, tuple[int, ...]]], seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    sd = {}
    for name, shape in shapes:
        sd[name] = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
    torch.cuda.synchronize()
    return sd


def nbytes_of(sd: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())
