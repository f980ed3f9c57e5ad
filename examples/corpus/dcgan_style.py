"""A DCGAN trained as pytorch/examples dcgan/main.py trains one, shrunk to 16x16.

Random "images" in a TensorDataset stand in for the image folder. Each iteration
updates D (two backward passes: real, then fake) with `optimizerD.step()`, then G with
`optimizerG.step()`: two optimizers, two `.step()` calls, one training iteration.
"""

from __future__ import annotations

import argparse
import json
import random

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="tiny DCGAN on random 16x16 images")
parser.add_argument("--batchSize", type=int, default=16, help="input batch size")
parser.add_argument("--nimages", type=int, default=320, help="size of the random dataset")
parser.add_argument("--nz", type=int, default=16, help="size of the latent z vector")
parser.add_argument("--ngf", type=int, default=16)
parser.add_argument("--ndf", type=int, default=16)
parser.add_argument("--niter", type=int, default=1, help="number of epochs to train for")
parser.add_argument("--lr", type=float, default=0.0002, help="learning rate, default=0.0002")
parser.add_argument("--beta1", type=float, default=0.5, help="beta1 for adam. default=0.5")
parser.add_argument("--workers", type=int, default=0, help="number of data loading workers")
parser.add_argument("--manualSeed", type=int, default=999, help="manual seed")
opt = parser.parse_args()
print(opt)

random.seed(opt.manualSeed)
torch.manual_seed(opt.manualSeed)

nc = 1
nz, ngf, ndf = opt.nz, opt.ngf, opt.ndf
images = torch.rand(opt.nimages, nc, 16, 16) * 2 - 1  # "normalised" to [-1, 1]
dataset = TensorDataset(images, torch.zeros(opt.nimages, dtype=torch.long))
dataloader = DataLoader(dataset, batch_size=opt.batchSize, shuffle=True, num_workers=opt.workers)


def weights_init(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            # z: nz x 1 x 1 -> (ngf*2) x 4 x 4
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            # -> ngf x 8 x 8
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            # -> nc x 16 x 16
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            # nc x 16 x 16 -> ndf x 8 x 8
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            # -> (ndf*2) x 4 x 4
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            # -> 1 x 1 x 1
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.main(input).view(-1, 1).squeeze(1)


netG = Generator()
netG.apply(weights_init)
netD = Discriminator()
netD.apply(weights_init)

criterion = nn.BCELoss()
real_label = 1.0
fake_label = 0.0

optimizerD = torch.optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

iterations = 0
printed: list[list[float]] = []
for epoch in range(opt.niter):
    for i, data in enumerate(dataloader, 0):
        ############################
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        ###########################
        # train with real
        netD.zero_grad()
        real_cpu = data[0]
        batch_size = real_cpu.size(0)
        label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype)

        output = netD(real_cpu)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean().item()

        # train with fake
        noise = torch.randn(batch_size, nz, 1, 1)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach())
        errD_fake = criterion(output, label)
        errD_fake.backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        optimizerD.step()

        ############################
        # (2) Update G network: maximize log(D(G(z)))
        ###########################
        netG.zero_grad()
        label.fill_(real_label)  # fake labels are real for generator cost
        output = netD(fake)
        errG = criterion(output, label)
        errG.backward()
        D_G_z2 = output.mean().item()
        optimizerG.step()
        iterations += 1

        print(
            "[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f"  # noqa: UP031
            % (
                epoch,
                opt.niter,
                i,
                len(dataloader),
                errD.item(),
                errG.item(),
                D_x,
                D_G_z1,
                D_G_z2,
            ),
            flush=True,
        )
        printed.append([errD.item(), errG.item()])

# losses: [Loss_D, Loss_G] per printed iteration (a GAN has no single loss)
record = {"iterations": iterations, "losses": printed[-5:], "batch_size": opt.batchSize}
print("CORPUS " + json.dumps(record), flush=True)
