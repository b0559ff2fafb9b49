"""Hugging Face GPT-2 decode step (batch 1, bf16, KV cache), eager or through torch.compile.

    python capture/gpt2_decode.py              # eager: one token per step against a KV cache
    python capture/gpt2_decode.py --compile    # torch.compile(model) (the fix)

The model is built from ``GPT2Config`` (random weights, no download): GPT-2's shape (12 layers,
d 768, 12 heads), bf16 weights. A prompt of ``--context`` tokens fills a ``DynamicCache`` once;
each step runs one token through the model with that cache, then crops the cache back to the
prompt's length, so every step has the same shapes (no recompiles; the step is a decode step at a
fixed context length). ``tracedx.step()`` marks each step. Needs ``transformers``.
"""

from __future__ import annotations

import torch
from _common import done, parser, setup, step_marker


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=30)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--compile", action="store_true", help="torch.compile(model) (the fix)")
    args = p.parse_args()
    device, small = setup(args)
    from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

    layers, context = (2, 16) if small else (args.layers, args.context)
    cfg = GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=1024)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = GPT2LMHeadModel(cfg).to(device=device, dtype=dtype).eval()
    run = torch.compile(model) if args.compile else model
    prompt = torch.randint(0, cfg.vocab_size, (1, context), device=device)
    with torch.inference_mode():  # inputs made inside too: a tensor from outside recompiles
        tok = torch.randint(0, cfg.vocab_size, (1, 1), device=device)
        pos = torch.full((1, 1), context, device=device)
        cache = DynamicCache(config=cfg)
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        for _ in range(args.steps):
            out = run(input_ids=tok, past_key_values=cache, position_ids=pos, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            cache.crop(-1)  # back to the prompt: the same shapes every step
            step_marker()
    done("gpt2_decode", args.steps, device, layers=layers, context=context, compile=args.compile)


if __name__ == "__main__":
    main()
