"""A user's script whose samples take a known time to decode (tests/test_stalls.py):
esync.ShardDataset with a transform that sleeps DELAY_MS per sample, in a DataLoader of
WORKERS worker processes, trained through the API.

    python tests/stall_script.py SHARDS DELAY_MS WORKERS [esync flags...]
"""
import sys
import time

import torch
from torch.utils.data import DataLoader

import esync


DELAY = float(sys.argv[2]) / 1000.0


def slow(image):  # sent to Ray tasks by value (__main__'s), DELAY with it: not sys.argv
    time.sleep(DELAY)
    return image


esync.init(sys.argv[4:])
model = esync.prepare_model(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)))
loader = esync.prepare_data_loader(DataLoader(
    esync.ShardDataset(sys.argv[1], transform=slow), batch_size=16, shuffle=True,
    num_workers=int(sys.argv[3])))
optimizer = esync.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
while not esync.should_stop():
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        esync.report(loss.item())
        loss.backward()
        optimizer.step()
