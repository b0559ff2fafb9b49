"""A Hugging Face Llama training step (bf16 autocast, AdamW), eager or through torch.compile.

    python capture/llama_train.py              # eager: LlamaForCausalLM from a config
    python capture/llama_train.py --compile    # torch.compile(model) (the fix)
    python capture/llama_train.py --batch 8    # twice the batch (larger-batch)

The model is built from ``LlamaConfig`` (random weights, no download): 8 layers, hidden 1024,
16 heads, MLP 2816, vocabulary 32000 (a TinyLlama-like width at a third of its depth), batch 4,
sequence 512, SDPA attention. Steps are marked by ``optimizer.step()``. Needs ``transformers``.
"""

from __future__ import annotations

import torch
from _common import done, parser, setup


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=16)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--compile", action="store_true", help="torch.compile(model) (the fix)")
    args = p.parse_args()
    device, small = setup(args)
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, batch, seq = (2, 2, 64) if small else (args.layers, args.batch, args.seq)
    cfg = LlamaConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
        max_position_embeddings=2048, attn_implementation="sdpa",
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = torch.compile(model) if args.compile else model
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16)
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
    done(
        "llama_train", args.steps, device, layers=layers, batch=batch, seq=seq,
        compile=args.compile,
    )  # fmt: skip


if __name__ == "__main__":
    main()
