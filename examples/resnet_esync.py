"""Train the ResNet of ``examples/resnet_bn.py`` with esync: resnet_plain.py's loop.

Run from the repository root::

    esync-run --workers 2 -m esync examples/resnet_esync.py --data /tmp/esync-shapes

Writes the synthetic image folder first if ``--data`` has none.  After every
``--eval-every`` epochs (default 1; 0: at the end only) prints ``epoch E step S
time Ts train_loss L test_accuracy A``, and once the time at which test accuracy
first reaches ``--target``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import esync
import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.resnet_bn import build_data, build_model, write_digits_folder, write_image_folder  # noqa: E402


@torch.no_grad()
def accuracy(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    """Fraction of correctly classified test images (BatchNorm in eval mode)."""
    model.eval()
    correct = total = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(1) == y).sum().item()
        total += len(y)
    model.train()
    return correct / total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "esync-shapes"))
    p.add_argument("--classes", type=int, default=4, help="when writing the folder: 4 (default) or up to 8, harder")
    p.add_argument("--digits", action="store_true", help="when writing the folder: the embedded digits, not shapes")
    p.add_argument("--width", type=int, default=16, help="channels of the first stage (32: build_wide_model)")
    p.add_argument("--augment", action="store_true", help="random crops of the training images (padding 3)")
    p.add_argument("--seconds", type=float, default=60.0, help="wall-clock training budget")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    p.add_argument("--target", type=float, default=0.9, help="report when test accuracy first reaches this")
    p.add_argument("--eval-every", type=int, default=1, help="epochs between test passes (0: at the end only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = p.parse_args()
    esync.init()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if not os.path.isdir(os.path.join(args.data, "train")):
        write_digits_folder(args.data) if args.digits else write_image_folder(args.data, classes=args.classes,
                                                                              seed=args.seed)
        print(f"wrote {args.data}", flush=True)
    device = esync.get_device()
    train_set, test_set = build_data(args.data, augment=args.augment)
    model = esync.prepare_model(build_model(num_classes=len(train_set.classes), width=args.width))
    opt = esync.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01))
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed))
    loader = esync.prepare_data_loader(loader)
    test_loader = DataLoader(test_set, batch_size=256)
    print(f"train images {len(train_set)} test images {len(test_set)} classes {train_set.classes}", flush=True)

    start = time.perf_counter()
    epoch = step = 0
    reached = None
    while time.perf_counter() - start < args.seconds and not esync.should_stop():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            esync.report(loss)
            opt.step()
            step += 1
        epoch += 1
        if not args.eval_every or epoch % args.eval_every or esync.get_session().rank != 0:  # test on one worker
            continue
        acc = accuracy(model, test_loader, device)
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch} step {step} time {elapsed:.1f}s train_loss {loss.item():.3f} test_accuracy {acc:.3f}",
              flush=True)
        if reached is None and acc >= args.target:
            reached = elapsed
            print(f"reached test_accuracy >= {args.target} at {elapsed:.1f}s (epoch {epoch})", flush=True)
    elapsed = time.perf_counter() - start
    if not args.eval_every and esync.get_session().rank == 0:
        print(f"epoch {epoch} step {step} time {elapsed:.1f}s test_accuracy "
              f"{accuracy(model, test_loader, device):.3f}", flush=True)
    print(f"done: {epoch} epochs, {step * args.batch_size / elapsed:.0f} samples/s (training and testing), "
          f"time to {args.target}: {'not reached' if reached is None else f'{reached:.1f}s'}", flush=True)


if __name__ == "__main__":
    main()
