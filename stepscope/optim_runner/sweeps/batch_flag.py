"""The batch-size flag of a job's command line, and the command with another value in it.

Training scripts are written with their batch size on the command line far more often
than with a DataLoader stepscope can rescale: pytorch/examples' ``--batch-size``,
nanoGPT-style ``--batch_size``, a first transformer's ``--batch``, HF Trainer's
``--per_device_train_batch_size``. A batch sweep of a training job (``largest_batch.py``)
changes that one value of the recorded command and nothing else, so each trial is the
user's own job at another batch. Only a flag whose value is a positive integer counts,
written ``--flag N`` or ``--flag=N``; the last one wins, as argparse reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Spellings seen in public training scripts, most specific first. Evaluation-only flags
# (``--test-batch-size``, ``--eval_batch_size``) are not the training batch.
FLAGS = (
    "--per_device_train_batch_size",
    "--per-device-train-batch-size",
    "--train_batch_size",
    "--train-batch-size",
    "--micro_batch_size",
    "--micro-batch-size",
    "--batch_size",
    "--batch-size",
    "--batchsize",
    "--batch",
    "--bs",
)


@dataclass(frozen=True)
class BatchFlag:
    """Where the batch size sits in a command: ``command[index]`` holds the value
    (``inline``: the item is ``--flag=N``)."""

    flag: str
    index: int
    value: int
    inline: bool

    def command_with(self, command: list[str], size: int) -> list[str]:
        """``command`` with the batch size ``size`` in place of this flag's value."""
        out = list(command)
        out[self.index] = f"{self.flag}={size}" if self.inline else str(size)
        return out


def find_batch_flag(command: list[str]) -> BatchFlag | None:
    """The training batch-size flag of ``command`` (the last one given), or None."""
    found: BatchFlag | None = None
    for i, item in enumerate(command):
        name, eq, value = item.partition("=")
        if name not in FLAGS:
            continue
        if eq:
            candidate = _flag(name, i, value, inline=True)
        elif i + 1 < len(command):
            candidate = _flag(name, i + 1, command[i + 1], inline=False)
        else:
            candidate = None
        found = candidate or found
    return found


def _flag(name: str, index: int, value: str, inline: bool) -> BatchFlag | None:
    if not value.isdigit() or int(value) < 1:
        return None
    return BatchFlag(name, index, int(value), inline)


__all__ = ["FLAGS", "BatchFlag", "find_batch_flag"]
