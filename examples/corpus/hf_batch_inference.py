"""Batch inference the Hugging Face way: a sequence classifier scoring a dataset.

`AutoModelForSequenceClassification` built from a small BERT config (random weights: the
hub is switched off before transformers is imported), a `Dataset` of tokenised examples
of different lengths, a DataLoader whose collate function pads each batch and builds
the attention mask, and the loop the docs show: `model.eval()`, `torch.no_grad()`,
`outputs = model(**batch)`, `outputs.logits.argmax(-1)`. No optimizer: each call of the
model is one step (kind `forward`), called with keyword arguments only.
"""

from __future__ import annotations

import argparse
import json
import os
import time

# Before transformers is imported: nothing may try the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

import torch  # noqa: E402
from torch.nn.utils.rnn import pad_sequence  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from transformers import AutoConfig, AutoModelForSequenceClassification, set_seed  # noqa: E402


class TokenizedTexts(Dataset):
    """`length` examples of random token ids, 16 to `max_len` long; the same on every run."""

    def __init__(self, length: int, max_len: int, vocab_size: int, seed: int) -> None:
        self.length, self.max_len, self.vocab_size, self.seed = length, max_len, vocab_size, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + i)
        n = int(torch.randint(16, self.max_len + 1, (1,), generator=g))
        return {"input_ids": torch.randint(1, self.vocab_size, (n,), generator=g)}


def collate(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    ids = pad_sequence([e["input_ids"] for e in examples], batch_first=True, padding_value=0)
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Score a dataset with a sequence classifier")
    p.add_argument("--num-examples", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--num-labels", type=int, default=3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    set_seed(args.seed)
    config = AutoConfig.for_model(
        "bert",
        vocab_size=2000,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=args.max_length,
        num_labels=args.num_labels,
    )
    model = AutoModelForSequenceClassification.from_config(config).to(args.device)
    model.eval()
    dataset = TokenizedTexts(args.num_examples, args.max_length, config.vocab_size, args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, collate_fn=collate)

    predictions, batches, start = [], 0, time.time()
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(args.device) for k, v in batch.items()}
            outputs = model(**batch)
            predictions.extend(outputs.logits.argmax(dim=-1).tolist())
            batches += 1
            print(f"batch {batches}/{len(loader)} ({time.time() - start:.1f} s)")
    counts = [predictions.count(label) for label in range(args.num_labels)]
    print(f"scored {len(predictions)} examples: {counts} per label")
    print(
        "CORPUS " + json.dumps({"iterations": batches, "losses": [], "batch_size": args.batch_size})
    )


if __name__ == "__main__":
    main()
