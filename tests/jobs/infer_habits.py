"""Batch inference with the habits the inference findings look for, chosen by flags.

--grad: forgets inference_mode/no_grad; --train-mode: never calls eval() (the model has
Dropout); --batch-size N; --calls N. Prints one PROBE line: what the job's own objects
showed on its last call (grad recorded, inference tensor, training mode, layer types).
No stepscope import.
"""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--calls", type=int, default=12)
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--grad", action="store_true")
p.add_argument("--train-mode", action="store_true")
a = p.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.3)
        self.lstm = nn.LSTM(32, 32, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        out, _ = self.lstm(self.drop(torch.relu(self.embed(x))))
        return self.head(out[:, -1])


model = Classifier()
if not a.train_mode:
    model.eval()
data = torch.randn(a.calls * a.batch_size, 6, 16)
loader = DataLoader(TensorDataset(data), batch_size=a.batch_size)
outputs = []
with torch.enable_grad() if a.grad else torch.no_grad():
    for (x,) in loader:
        y = model(x)
        outputs.append(y.detach().clone() if not y.is_inference() else y.clone())
print(
    "PROBE "
    + json.dumps(
        {
            "requires_grad": y.requires_grad,
            "inference_tensor": y.is_inference(),
            "training": model.training,
            "layers": sorted(
                {type(m).__module__ + "." + type(m).__name__ for m in model.modules()}
            ),
            "first_output": outputs[0][0].tolist(),
            "last_output": outputs[-1][0].tolist(),
        }
    )
)
