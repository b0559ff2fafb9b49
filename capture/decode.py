"""Batch-1 decode of a GPT-2-medium-shaped decoder (random weights, bf16): eager vs CUDA graph.

    python capture/decode.py                 # eager, KV cache grown with torch.cat per token
    python capture/decode.py --static-cache  # eager, preallocated KV cache (no graph)
    python capture/decode.py --cuda-graph    # static KV cache, one CUDA graph per token (fix)

24 layers, d_model 1024, 16 heads, MLP 4096, vocabulary 50257 (GPT-2 medium's shapes, random
weights: nothing is downloaded). A 16-token prompt is run first (setup), then one token per
step, greedy, marked with ``tracedx.step()``. An earlier run on an H200 (another day, not recorded here): 20.0 ms eager, 1.63 ms with
a CUDA graph and a static KV cache. On PyTorch 2.11 / H200 the eager loop's attention goes to
cuDNN, which plans again for every new KV length (a host cost per token); ``--static-cache``
keeps the shapes fixed, so only the launches are left for the graph to remove.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import done, parser, setup, step_marker
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def _qkv(self, x: torch.Tensor):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.heads, d // self.heads)
        return (z.view(shape).transpose(1, 2) for z in (q, k, v))

    def _out(self, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    def forward_dynamic(self, x: torch.Tensor, cache: list) -> torch.Tensor:
        """Eager decoding: the cache grows by concatenation (a new tensor every token)."""
        q, k, v = self._qkv(x)
        if cache:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        cache[:] = [k, v]
        att = F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1)
        return self._out(x, att)

    def forward_static(self, x, k_cache, v_cache, pos, mask) -> torch.Tensor:
        """One token with a preallocated cache: write at ``pos``, attend under ``mask``."""
        q, k, v = self._qkv(x)
        k_cache.index_copy_(2, pos, k)
        v_cache.index_copy_(2, pos, v)
        att = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        return self._out(x, att)


class Decoder(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, vocab: int, max_len: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))


def main() -> None:
    p = parser(__doc__.splitlines()[0], steps=20)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens run before the steps")
    p.add_argument("--static-cache", action="store_true", help="eager with a static KV cache")
    p.add_argument("--cuda-graph", action="store_true", help="static cache + CUDA graph (fix)")
    args = p.parse_args()
    device, small = setup(args)
    layers, d, heads, vocab = args.layers, args.d_model, args.heads, args.vocab
    if small:
        layers, d, heads, vocab = min(layers, 2), min(d, 128), min(heads, 4), min(vocab, 1000)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    warm = 3  # tokens decoded before a graph is captured
    max_len = args.prompt + warm + args.steps + 1
    model = Decoder(layers, d, heads, vocab, max_len).to(device=device, dtype=dtype).eval()
    for prm in model.parameters():
        nn.init.normal_(prm, std=0.02)
    prompt = torch.randint(0, vocab, (1, args.prompt), device=device)

    with torch.inference_mode():
        if not (args.cuda_graph or args.static_cache):
            caches = [[] for _ in model.blocks]

            def run(ids: torch.Tensor, start: int) -> torch.Tensor:
                positions = torch.arange(start, start + ids.shape[1], device=device)
                x = model.wte(ids) + model.wpe(positions)
                for blk, cache in zip(model.blocks, caches, strict=True):
                    x = blk.forward_dynamic(x, cache)
                return model.logits(x[:, -1:]).argmax(dim=-1)

            tok = run(prompt, 0)
            pos = args.prompt
            for _ in range(args.steps):
                tok = run(tok, pos)
                pos += 1
                step_marker()
        else:
            if args.cuda_graph and device.type != "cuda":
                p.error("--cuda-graph needs a CUDA device")
            hd = d // heads
            k_caches = [
                torch.zeros(1, heads, max_len, hd, device=device, dtype=dtype) for _ in model.blocks
            ]
            v_caches = [torch.zeros_like(k) for k in k_caches]
            positions = torch.arange(max_len, device=device)
            pos = torch.zeros(1, dtype=torch.long, device=device)
            tok = torch.zeros(1, 1, dtype=torch.long, device=device)

            def one_token() -> None:
                mask = (positions <= pos).view(1, 1, 1, max_len)
                x = model.wte(tok) + model.wpe(pos)
                for blk, kc, vc in zip(model.blocks, k_caches, v_caches, strict=True):
                    x = blk.forward_static(x, kc, vc, pos, mask)
                tok.copy_(model.logits(x).argmax(dim=-1))
                pos.add_(1)

            for i in range(args.prompt):  # prompt, one token at a time into the static cache
                tok.copy_(prompt[:, i : i + 1])
                one_token()
            if not args.cuda_graph:
                for _ in range(args.steps):
                    one_token()
                    step_marker()
                done("decode", args.steps, device, layers=layers, static_cache=True)
                return
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warm):
                    one_token()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                one_token()
            for _ in range(args.steps):
                graph.replay()
                step_marker()
    done("decode", args.steps, device, layers=layers, d_model=d, cuda_graph=args.cuda_graph)


if __name__ == "__main__":
    main()
