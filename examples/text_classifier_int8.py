"""Text classifier (embedding, LSTM, Linear head) scoring a dataset on the CPU: the step is
the LSTM's and the head's float32 GEMMs, which dynamic int8 quantisation speeds up.

Inference written correctly (`eval()`, `torch.inference_mode()`); what is left is the
arithmetic. On a CPU, `torch.ao.quantization.quantize_dynamic` turns the LSTM's and the
Linear layers' weights into int8 and runs them on int8 kernels (fbgemm/x86): the weights
are a quarter of the bytes and the batch is small (8 sentences), so the GEMMs are bound
by reading the weights. stepscope's fix `int8_dynamic_quant` applies it without a code
change; it changes the outputs a little, so it needs `--allow-numerics`. Random weights,
generated token data: nothing is downloaded.

    python examples/text_classifier_int8.py           # ~20 s on 2 cores
"""

from __future__ import annotations

import time

import torch
from _common import IterationTimer, base_parser, log_every, pick_device, seed_everything
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NUM_CLASSES = 4


class TextClassifier(nn.Module):
    def __init__(self, vocab: int, embed: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, NUM_CLASSES)
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm(self.embed(tokens))
        return self.head(h[-1])


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], steps=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--embed", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=20000)
    args = parser.parse_args()

    seed_everything(args.seed)
    device = pick_device(args.device)
    n = 4096
    tokens = torch.randint(0, args.vocab, (n, args.seq_len))
    loader = DataLoader(TensorDataset(tokens), batch_size=args.batch_size)
    model = TextClassifier(args.vocab, args.embed, args.hidden).to(device).eval()
    timer = IterationTimer(args.timings_out, device)
    every = log_every(args)
    step, predictions = 0, []
    try:
        with torch.inference_mode():
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
        timer.write(example="text_classifier_int8", steps=step)
    counts = torch.bincount(torch.cat(predictions).cpu(), minlength=NUM_CLASSES)
    print(f"predicted classes: {counts.tolist()}")


if __name__ == "__main__":
    main()
