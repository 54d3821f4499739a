"""A user's script over shards (tests/test_shard_data.py): esync.ShardDataset in a
DataLoader whose two worker processes decode the samples, trained through the API."""
import sys

import torch
from torch.utils.data import DataLoader

import esync

esync.init()
model = esync.prepare_model(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)))
loader = esync.prepare_data_loader(DataLoader(esync.ShardDataset(sys.argv[1]), batch_size=16,
                                              shuffle=True, num_workers=2))
optimizer = esync.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
while not esync.should_stop():
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        esync.report(loss.item())
        loss.backward()
        optimizer.step()
