"""Hugging Face GPT-2 training step (bf16 autocast, AdamW), eager or through torch.compile.

    python capture/gpt2_train.py              # eager: GPT2LMHeadModel from a config, bf16 autocast
    python capture/gpt2_train.py --compile    # torch.compile(model) (the fix)

The model is built from ``GPT2Config`` (random weights, no download): distilgpt2's shape by
default (6 layers, d 768, 12 heads, vocab 50257), batch 8, sequence 512. Steps are marked by
``optimizer.step()``. Needs ``transformers``.
"""

from __future__ import annotations

import torch
from _common import done, parser, setup


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--compile", action="store_true", help="torch.compile(model) (the fix)")
    args = p.parse_args()
    device, small = setup(args)
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, batch, seq = (2, 2, 64) if small else (args.layers, args.batch, args.seq)
    cfg = GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=1024)
    model = GPT2LMHeadModel(cfg).to(device)
    model.train()
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
        "gpt2_train", args.steps, device, layers=layers, batch=batch, seq=seq, compile=args.compile
    )


if __name__ == "__main__":
    main()
