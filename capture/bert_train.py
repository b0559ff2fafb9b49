"""A Hugging Face BERT masked-language-model training step (AdamW), fp32, TF32 or bf16 autocast.

    python capture/bert_train.py                # strict fp32 (TF32 off, PyTorch's matmul default)
    python capture/bert_train.py --bf16         # bf16 autocast (the fix)
    python capture/bert_train.py --tf32         # TF32 matmuls allowed (the fix)
    python capture/bert_train.py --bf16 --batch 64   # twice the batch (larger-batch)
    python capture/bert_train.py --bf16 --compile   # bf16, through torch.compile (the fix)

The model is ``BertForMaskedLM`` built from ``BertConfig`` (random weights, no download):
BERT-base's shape (12 layers, hidden 768, 12 heads, MLP 3072, vocabulary 30522), batch 32,
sequence 128, SDPA attention, labels on every token. Steps are marked by ``optimizer.step()``.
Needs ``transformers``.
"""

from __future__ import annotations

import torch
from _common import done, parser, setup


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=16)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile(model) (the fix)")
    p.add_argument("--tf32", action="store_true", help="TF32 for matmuls")
    args = p.parse_args()
    device, small = setup(args)
    from transformers import BertConfig, BertForMaskedLM

    layers, batch, seq = (2, 2, 32) if small else (args.layers, args.batch, args.seq)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32  # PyTorch's default: False
    cfg = BertConfig(num_hidden_layers=layers, attn_implementation="sdpa")  # BERT-base widths
    model = BertForMaskedLM(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = torch.compile(model) if args.compile else model
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
    done(
        "bert_train", args.steps, device, layers=layers, batch=batch, seq=seq, bf16=args.bf16,
        tf32=args.tf32, compile=args.compile,
    )  # fmt: skip


if __name__ == "__main__":
    main()
