"""A text-generation HTTP server, as a first one is written: a Llama-style causal LM behind
`http.server`, one `model.generate()` per POST.

The model is built from a `LlamaConfig` (random weights: nothing is downloaded; 4 layers,
256 wide over 8192 token ids). A POST carries JSON `{"prompt_len": P, "max_new_tokens": K,
"seed": S}`; the server makes a prompt of P token ids from the seed, runs greedy
`generate(..., max_new_tokens=K, min_new_tokens=K)`, and answers with the new tokens'
count. Between requests the main thread waits in `serve_forever`. It prints
`listening on PORT` once it listens. Started plainly (`python generation_server.py`) and
attached to while a client sends requests (tests/test_attach_inject.py).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os

# Before transformers is imported: nothing may try the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402


def build_model(vocab: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=vocab - 1,
        pad_token_id=vocab - 1,
    )
    return LlamaForCausalLM(config).eval()


class Handler(http.server.BaseHTTPRequestHandler):
    model: LlamaForCausalLM
    vocab: int

    def do_POST(self) -> None:
        ask = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        prompt_len = int(ask.get("prompt_len", 16))
        new = int(ask.get("max_new_tokens", 16))
        generator = torch.Generator().manual_seed(int(ask.get("seed", 0)))
        ids = torch.randint(1, self.vocab - 1, (1, prompt_len), generator=generator)
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
            )
        body = json.dumps({"new_tokens": int(out.shape[1] - prompt_len)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description="A generate() per POST")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=8192)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    Handler.model = build_model(args.vocab_size)
    Handler.vocab = args.vocab_size
    server = http.server.HTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
