"""Generation jobs for the collector's tests: one tiny model, the ways scripts call it.

--mode generate     HF generate() per prompt (GPT-2 from a config, random weights)
--mode batched      one generate() of all prompts, left-padded, with an attention mask
--mode nocache      a nanoGPT-style loop: the whole sequence again for every token
--mode cache        a loop with a KV cache: the prompt, then one token per call
--mode classify     not generation: token-id batches of one length, under no_grad
--mode growing      not generation: a length-sorted evaluation, 20, 21, 22... tokens
--mode error        generate() raises on the second request (a bad argument)
--mode edge         an empty prompt and max_new_tokens=0 (each raises: caught), a
                    TextStreamer, then one plain request
--mode hang         a first request, then a loop that calls the model for ever (killed)

Prints one line per request (its new tokens and its own perf_counter latency) and, last,
``GEN {json}`` with the script's own counts.
"""

import argparse
import json
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TextStreamer

VOCAB = 128


def model(n_layer: int = 1) -> GPT2LMHeadModel:
    config = GPT2Config(
        n_layer=n_layer, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=256,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def prompts(n: int, length: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, VOCAB, (1, length), generator=g) for _ in range(n)]


def timed(fn):  # noqa: ANN001, ANN201
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="generate")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=12)
    p.add_argument("--new", type=int, default=10)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    m = model()
    news, latencies = [], []
    ps = prompts(a.requests, a.prompt_len)
    if a.mode == "generate":
        for ids in ps:
            out, dt = timed(lambda ids=ids: m.generate(ids, max_new_tokens=a.new, do_sample=False))
            news.append(out.shape[1] - ids.shape[1])
            latencies.append(dt)
    elif a.mode == "batched":
        lengths = [a.prompt_len - i for i in range(a.requests)]
        rows = [ids[0, :n].tolist() for ids, n in zip(ps, lengths, strict=True)]
        width = max(lengths)
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        out, dt = timed(lambda: m.generate(ids, attention_mask=mask, max_new_tokens=a.new))
        news.append(int((out.shape[1] - width) * len(rows)))
        latencies.append(dt)
    elif a.mode in ("nocache", "cache"):
        for ids in ps:
            out, dt = timed(lambda ids=ids: loop(m, ids, a.new, cache=a.mode == "cache"))
            news.append(out.shape[1] - ids.shape[1])
            latencies.append(dt)
    elif a.mode == "classify":
        with torch.no_grad():
            for ids in ps:
                m(ids)
    elif a.mode == "growing":
        with torch.no_grad():
            for k in range(a.requests):
                m(torch.randint(3, VOCAB, (2, 20 + k)))
    elif a.mode == "error":
        out, dt = timed(lambda: m.generate(ps[0], max_new_tokens=a.new))
        news.append(out.shape[1] - ps[0].shape[1])
        latencies.append(dt)
        print(f"GEN {json.dumps({'new_tokens': news, 'latencies_s': latencies})}", flush=True)
        m.generate(ps[1], max_new_tokens=a.new, num_beams=0)  # raises: the job fails
    elif a.mode == "edge":
        for kwargs in ({"input_ids": ps[0][:, :0]}, {"input_ids": ps[0], "max_new_tokens": 0}):
            try:
                m.generate(**{"max_new_tokens": a.new, **kwargs})
                print("edge call returned")
            except Exception as exc:
                print(f"edge call raised {type(exc).__name__}")
        out, dt = timed(lambda: m.generate(ps[1], max_new_tokens=a.new, streamer=Streamer()))
        news.append(out.shape[1] - ps[1].shape[1])
        latencies.append(dt)
        out, dt = timed(lambda: m.generate(ps[2], max_new_tokens=a.new))
        news.append(out.shape[1] - ps[2].shape[1])
        latencies.append(dt)
    elif a.mode == "hang":
        out, dt = timed(lambda: loop(m, ps[0], a.new, cache=False))
        news.append(out.shape[1] - ps[0].shape[1])
        latencies.append(dt)
        print(f"GEN {json.dumps({'new_tokens': news, 'latencies_s': latencies})}", flush=True)
        loop(m, ps[1], 10**9, cache=False, slow=True)
    for i, (n, dt) in enumerate(zip(news, latencies, strict=True)):
        print(f"request {i}: {n} new tokens in {dt:.4f} s")
    print(f"GEN {json.dumps({'new_tokens': news, 'latencies_s': latencies})}")


class Streamer(TextStreamer):
    """A TextStreamer without a tokenizer: prints token ids as they come."""

    def __init__(self) -> None:
        self.seen = 0

    def put(self, value: torch.Tensor) -> None:
        self.seen += 1
        sys.stdout.write(".")

    def end(self) -> None:
        sys.stdout.write(f" streamed {self.seen}\n")


@torch.no_grad()
def loop(m: GPT2LMHeadModel, ids: torch.Tensor, new: int, cache: bool, slow: bool = False):  # noqa: ANN201
    """Greedy decoding by hand, with or without the model's KV cache."""
    past = None
    seq = ids
    for _ in range(new):
        if cache:
            out = m(input_ids=seq if past is None else seq[:, -1:], past_key_values=past)
            past = out.past_key_values
        else:
            out = m(seq[:, -64:])
        nxt = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        seq = torch.cat((seq, nxt), dim=1)
        if slow:
            print("token", flush=True)
            time.sleep(0.05)
    return seq


if __name__ == "__main__":
    main()
