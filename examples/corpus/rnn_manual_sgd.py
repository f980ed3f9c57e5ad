"""Word-level LSTM language model, as the old pytorch/examples word_language_model.

No `torch.optim`: after `loss.backward()` the script clips the gradients and updates
the weights by hand (`p.data.add_(p.grad, alpha=-lr)`). Batches are bptt windows cut
from one batchified token tensor by `get_batch(source, i)` (no DataLoader), and each
epoch ends with `evaluate()` on the validation tokens under `torch.no_grad()`. A
generated corpus replaces Wikitext-2. Each batch takes a few milliseconds.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser(description="PyTorch LSTM Language Model (generated corpus)")
parser.add_argument("--ntokens", type=int, default=1000, help="size of the vocabulary")
parser.add_argument("--emsize", type=int, default=32, help="size of word embeddings")
parser.add_argument("--nhid", type=int, default=32, help="number of hidden units per layer")
parser.add_argument("--nlayers", type=int, default=1, help="number of layers")
parser.add_argument("--lr", type=float, default=20, help="initial learning rate")
parser.add_argument("--clip", type=float, default=0.25, help="gradient clipping")
parser.add_argument("--epochs", type=int, default=1, help="upper epoch limit")
parser.add_argument("--batches", type=int, default=200, help="training batches per epoch")
parser.add_argument("--batch_size", type=int, default=8, metavar="N", help="batch size")
parser.add_argument("--bptt", type=int, default=10, help="sequence length")
parser.add_argument("--dropout", type=float, default=0.2, help="dropout applied to layers")
parser.add_argument("--seed", type=int, default=1111, help="random seed")
parser.add_argument("--log-interval", type=int, default=50, metavar="N", help="report interval")
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cpu")


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout if nlayers > 1 else 0.0)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid
        self.nlayers = nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input: torch.Tensor, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int):
        weight = next(self.parameters())
        return (
            weight.new_zeros(self.nlayers, bsz, self.nhid),
            weight.new_zeros(self.nlayers, bsz, self.nhid),
        )


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    # Work out how cleanly we can divide the dataset into bsz parts.
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = source[i : i + seq_len]
    target = source[i + 1 : i + 1 + seq_len].view(-1)
    return data, target


# "corpus": a Zipf-ish token stream, so the model has something to learn
probs = 1.0 / torch.arange(1, args.ntokens + 1, dtype=torch.float)
train_tokens = torch.multinomial(probs, args.batches * args.bptt * args.batch_size + 1, True)
val_tokens = torch.multinomial(probs, 10 * args.bptt * 10 + 1, True)
eval_batch_size = 10
train_data = batchify(train_tokens, args.batch_size)
val_data = batchify(val_tokens, eval_batch_size)

model = RNNModel(args.ntokens, args.emsize, args.nhid, args.nlayers, args.dropout).to(device)
criterion = nn.NLLLoss()


def evaluate(data_source: torch.Tensor) -> float:
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


iterations = 0
printed: list[float] = []


def train(epoch: int) -> None:
    global iterations
    model.train()
    total_loss, logged = 0.0, 0
    start_time = time.time()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        # Starting each batch, we detach the hidden state from how it was previously produced.
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()

        # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        iterations += 1

        total_loss += loss.item()
        logged += 1
        if (batch + 1) % args.log_interval == 0:
            cur_loss = total_loss / logged
            elapsed = time.time() - start_time
            print(
                f"| epoch {epoch:3d} | batch {batch + 1:5d} | lr {lr:02.2f} "
                f"| ms/batch {elapsed * 1000 / logged:5.2f} | loss {cur_loss:5.4f} "
                f"| ppl {math.exp(cur_loss):8.2f}",
                flush=True,
            )
            printed.append(cur_loss)
            total_loss, logged = 0.0, 0
            start_time = time.time()


lr = args.lr
best_val_loss = None
for epoch in range(1, args.epochs + 1):
    epoch_start_time = time.time()
    train(epoch)
    val_loss = evaluate(val_data)
    print("-" * 89)
    print(
        f"| end of epoch {epoch:3d} | time: {time.time() - epoch_start_time:5.2f}s "
        f"| valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):8.2f}"
    )
    print("-" * 89)
    if not best_val_loss or val_loss < best_val_loss:
        best_val_loss = val_loss
    else:
        # Anneal the learning rate if no improvement has been seen in the validation dataset.
        lr /= 4.0

record = {"iterations": iterations, "losses": printed[-5:], "batch_size": args.batch_size}
print("CORPUS " + json.dumps(record), flush=True)
