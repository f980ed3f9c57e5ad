"""Causal-LM fine-tuning the Hugging Face way: `Trainer` + `TrainingArguments`.

A tiny randomly initialised GPT-2 on random tokens (no download: the hub is switched
off before transformers is imported), gradient accumulation of 2, so one optimizer
step is two micro-batches: the Trainer's `global_step` counts optimizer steps, and so
must anything that times this job. The loss lines are the Trainer's own log dicts.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

# Before transformers is imported: nothing may try the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
    set_seed,
)


class RandomTokens(Dataset):
    """`length` sequences of random token ids; item i is the same on every run."""

    def __init__(self, length: int, seq_len: int, vocab_size: int, seed: int) -> None:
        self.length = length
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + i)
        ids = torch.randint(0, self.vocab_size, (self.seq_len,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Tiny GPT-2 causal LM with the HF Trainer")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--per-device-train-batch-size", type=int, default=8)
    p.add_argument("--gradient-accumulation-steps", type=int, default=2)
    p.add_argument("--dataloader-num-workers", type=int, default=0)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--logging-steps", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2, help="GPT-2 blocks")
    p.add_argument("--n-embd", type=int, default=64, help="hidden size")
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--output-dir", default=None, help="default: a temporary directory")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    set_seed(args.seed)
    config = GPT2Config(
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        vocab_size=512,
        n_positions=max(64, args.seq_len),
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    samples = args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps
    train_dataset = RandomTokens(samples, args.seq_len, config.vocab_size, args.seed)

    with tempfile.TemporaryDirectory() as tmp:
        training_args = TrainingArguments(
            output_dir=args.output_dir or tmp,
            max_steps=args.max_steps,
            per_device_train_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            learning_rate=args.learning_rate,
            dataloader_num_workers=args.dataloader_num_workers,
            logging_steps=args.logging_steps,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            seed=args.seed,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset)
        trainer.train()

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    record = {
        "iterations": trainer.state.global_step,
        "losses": losses[-5:],
        # samples per optimizer step: every micro-batch of the accumulation
        "batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps,
    }
    print("CORPUS " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
