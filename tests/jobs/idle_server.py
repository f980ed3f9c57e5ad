"""A model behind `http.server`, as a first inference server is written: each POST runs
one forward of a small MLP; between requests the main thread waits in `serve_forever`.
Prints its port once it listens (tests/test_stacks.py attaches to it)."""

import http.server
import json

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).eval()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with torch.no_grad():
            for _ in range(40):  # a few tens of ms of model work per request
                out = model(torch.randn(64, 512))
        body = json.dumps({"mean": float(out.mean())}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
print(f"listening on {server.server_address[1]}", flush=True)
server.serve_forever()
