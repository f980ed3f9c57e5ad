"""Batch inference that forgets `torch.inference_mode()`: a sentence classifier scoring a
dataset, its forward run under grad mode.

The script is the way batch scoring is often written: load the model, call `eval()`,
loop over a DataLoader, collect the predictions. What it forgets is
`with torch.inference_mode():` (or `torch.no_grad()`) around the loop, so every forward
records the autograd graph (one node per op, every activation kept for a backward that
never comes), and `nn.TransformerEncoder` cannot take its inference fast path
("BetterTransformer": fused kernels, and nested tensors that skip the padding of the
batch's shorter sentences), which runs only when no gradient is recorded.

Steps: no optimizer, so each call of the outermost module (`model(tokens)`) is one
step. Bottleneck: the forward's autograd recording; stepscope's finding "Inference
records gradients" comes first, with the fix `inference_mode` (applied without a code
change by `stepscope optimize`; numerics unchanged). Random weights, generated tokens:
nothing is downloaded.

    python examples/inference_no_inference_mode.py           # ~20 s on 2 cores
"""

from __future__ import annotations

import time

import torch
from _common import IterationTimer, base_parser, log_every, pick_device, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES = 5
PAD = 0


class SentenceClassifier(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(1, max_len, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, NUM_CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        padding = tokens == PAD
        x = self.embed(tokens) + self.position[:, : tokens.shape[1]]
        x = self.encoder(x, src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(x.dtype)  # mean over the real tokens only
        return self.head((x * keep).sum(dim=1) / keep.sum(dim=1))


def padded_sentences(n: int, max_len: int, vocab: int) -> torch.Tensor:
    """n tokenised sentences of 8 to max_len tokens, padded to max_len with PAD."""
    lengths = torch.randint(8, max_len + 1, (n,))
    tokens = torch.randint(1, vocab, (n, max_len))
    return tokens.masked_fill(torch.arange(max_len)[None, :] >= lengths[:, None], PAD)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], steps=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8000)
    args = parser.parse_args()

    seed_everything(args.seed)
    device = pick_device(args.device)
    n = 2048
    tokens = padded_sentences(n, args.seq_len, args.vocab)
    loader = DataLoader(TensorDataset(tokens), batch_size=args.batch_size)
    model = SentenceClassifier(args.vocab, args.dim, args.layers, 4, args.seq_len).to(device)
    model.eval()
    timer = IterationTimer(args.timings_out, device)
    every = log_every(args)
    step, predictions = 0, []
    try:
        timer.restart()
        while step < args.steps:
            for (batch,) in loader:
                logits = model(batch.to(device))
                predictions.append(logits.argmax(dim=-1))
                step += 1
                timer.tick()
                if step % every == 0:
                    elapsed = time.perf_counter() - timer.started
                    print(f"step {step}/{args.steps} ({elapsed:.1f} s)")
                if step >= args.steps:
                    break
    finally:
        timer.write(example="inference_no_inference_mode", steps=step)
    counts = torch.bincount(torch.cat(predictions).cpu(), minlength=NUM_CLASSES)
    print(f"predicted classes: {counts.tolist()}")


if __name__ == "__main__":
    main()
