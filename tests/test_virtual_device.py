"""The virtual device (tests/virtual_device.py): CUDA's "same device" rule on a CPU-only
machine, so that a batch a loop forgets to move fails here as it would on a GPU.

In this process under `VirtualDevice`; then whole scripts run with
`PYTHONPATH=tests/virtual_device ESYNC_VIRTUAL_DEVICE=1` (its sitecustomize), a plain
PyTorch loop and one on esync's API."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import CLUSTER_VARIABLES, REPO
from tests.virtual_device import HOST, VirtualDevice

SITE = os.path.join(REPO, "tests", "virtual_device")
SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices"
DEV = torch.device("cpu")  # the training device of this machine


@pytest.fixture
def vd():
    with VirtualDevice() as mode:
        yield mode


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def data(n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


# --- in this process ------------------------------------------------------------------
def test_a_batch_not_moved_fails_as_on_a_gpu_and_a_moved_one_works(vd):
    torch.manual_seed(0)
    model = mlp().to("cpu")
    x, _ = data()
    expected = model(x.to(DEV))  # moved: fine
    with pytest.raises(RuntimeError, match=SAME_DEVICE + r".*cuda:0 and cpu! \(virtual device: "):
        model(x)
    assert all(vd.on_device(p) for p in model.parameters())
    assert not vd.on_device(x)  # moving x made a copy: x itself stayed on the host
    with torch.overrides._pop_mode_temporarily():  # nothing else changes: the same values
        assert torch.equal(expected, model(x))


def test_the_ops_cuda_refuses_for_host_inputs(vd):
    weight = torch.randn(10, 4, device=DEV)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        F.embedding(torch.tensor([1, 2, 3]), weight)  # index_select on the host index
    F.embedding(torch.tensor([1, 2, 3]).to(DEV), weight)
    logits = torch.randn(5, 3).to(DEV)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        F.cross_entropy(logits, torch.tensor([0, 1, 2, 0, 1]))
    loss = F.cross_entropy(logits, torch.tensor([0, 1, 2, 0, 1], device=DEV))
    assert vd.on_device(loss) and isinstance(loss.item(), float)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):  # a device index into host data
        torch.arange(10)[torch.tensor([1, 2], device=DEV)]
    with pytest.raises(RuntimeError, match=SAME_DEVICE):  # a device scalar into a host op
        torch.ones(3) * loss


def test_cpu_scalars_indexing_and_metadata_may_mix(vd):
    t = torch.randn(4, 3, device=DEV)
    host_scalar = torch.tensor(2.0)
    assert vd.on_device(host_scalar * t) and vd.on_device(t + host_scalar)
    assert vd.on_device(t[torch.tensor([0, 2])])
    assert vd.on_device(t[torch.tensor([True, False, True, False])])
    t[torch.tensor([1])] = torch.zeros(1, 3)
    t[0] = torch.ones(3)
    t.copy_(torch.zeros(4, 3))
    assert vd.on_device(t) and t.size() == (4, 3) and t.dim() == 2 and len(t) == 4
    assert t.shape == torch.Size([4, 3]) and t.dtype == torch.float32 and t.is_floating_point()
    with pytest.raises(RuntimeError, match=SAME_DEVICE):  # a host scalar written with device data
        host_scalar.add_(torch.tensor(1.0, device=DEV))


def test_where_tensors_are(vd):
    host = torch.randn(3)
    assert not vd.on_device(host) and not vd.on_device(torch.from_numpy(np.zeros(3)))
    assert not vd.on_device(torch.zeros(3)) and not vd.on_device(torch.zeros_like(host))
    for made in (torch.zeros(3, device=DEV), torch.arange(3, device="cpu"),
                 torch.tensor([1.0], device=DEV), torch.as_tensor(host, device=DEV),
                 torch.zeros_like(host, device=DEV), host.to(DEV, non_blocking=True),
                 host.to(torch.device("cpu")), host.cuda()):
        assert vd.on_device(made)
    assert not vd.on_device(host)  # as_tensor / to returned a copy, not host itself
    moved = host.to(DEV)
    assert vd.on_device(moved.to(dtype=torch.float64)) and vd.on_device(moved[1:])
    assert vd.on_device(torch.zeros(2).to(moved)) and not vd.on_device(moved.to(host))
    assert all(vd.on_device(v) for v in (moved.view(3, 1), moved.detach(), moved.data))
    back = moved.cpu()
    assert not vd.on_device(back) and vd.on_device(moved)  # .cpu() is a copy to the host
    # x.device of a host tensor names the host: the idiom `device=x.device` follows x
    assert host.device is HOST and host.device == DEV and moved.device is not HOST
    assert not vd.on_device(torch.arange(3, device=host.device))
    assert vd.on_device(torch.arange(3, device=moved.device))
    assert vd.on_device(nn.Linear(2, 2, device=DEV).weight)
    assert not vd.on_device(nn.Linear(2, 2).weight)


def test_numpy_of_a_device_tensor_fails_as_on_cuda(vd):
    t = torch.randn(3).to(DEV)
    with pytest.raises(TypeError, match=r"can't convert cuda:0 device type tensor to numpy\. "
                                        r"Use Tensor\.cpu\(\) to copy"):
        t.numpy()
    with pytest.raises(TypeError, match="can't convert cuda:0"):
        np.asarray(t)
    assert t.cpu().numpy().shape == (3,) and len(t.tolist()) == 3 and isinstance(t[0].item(), float)
    assert torch.randn(3).numpy().shape == (3,)


def train(model, optimizer, steps: int = 4, clip: bool = False, amp: bool = False):
    x, y = data()
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    for _ in range(steps // len(loader) + 1):
        for xb, yb in loader:
            xb, yb = xb.to(DEV), yb.to(DEV)
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                out = model(xb)
            loss = F.cross_entropy(out.float(), yb)
            loss.backward()
            if clip:
                nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
    return loss.item()


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),  # CUDA's default path
], ids=["sgd", "sgd-foreach", "adamw", "adamw-foreach"])
def test_optimizers_on_device_parameters_step_with_no_false_error(make):
    """Optimizer state (zeros_like, clone of the gradient, the step count: a CPU scalar)
    follows the parameters; the weights come out exactly as without the virtual device."""
    weights = []
    for virtual in (True, False):
        torch.manual_seed(0)
        if virtual:
            with VirtualDevice() as mode:
                model = mlp().to(DEV)
                optimizer = make(model.parameters())
                train(model, optimizer, clip=True)
                state = [t for s in optimizer.state.values() for t in s.values()
                         if isinstance(t, torch.Tensor) and t.dim()]
                assert state and all(mode.on_device(t) for t in state)
                assert all(mode.on_device(p.grad) for p in model.parameters())
        else:
            model = mlp()
            train(model, make(model.parameters()), clip=True)
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights))


def test_norm_layers_autocast_clipping_and_checkpoints_work(vd):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.LayerNorm(16),
                          nn.Linear(16, 3)).to(DEV)
    assert all(vd.on_device(b) for b in model.buffers())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert isinstance(train(model, optimizer, clip=True, amp=True), float)
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 8).to(DEV))
    saved = {k: v.cpu() for k, v in model.state_dict().items()}  # a checkpoint, on the host
    assert not any(vd.on_device(v) for v in saved.values())
    model.load_state_dict(saved)  # copied back in: the parameters stay on the device
    optimizer.load_state_dict(optimizer.state_dict())
    assert all(vd.on_device(p) for p in model.parameters())
    assert train(model, optimizer) > 0


# --- whole processes (tests/virtual_device/sitecustomize.py) ---------------------------------
SCRIPT = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cpu")
torch.manual_seed(0)
x = torch.randn(256, 8)
y = (x[:, 0] > 0).long()
train = DataLoader(TensorDataset(x[:192], y[:192]), batch_size=32, shuffle=True,
                   num_workers=2, persistent_workers=True)  # forked: they inherit the mode
val = DataLoader(TensorDataset(x[192:], y[192:]), batch_size=32)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for epoch in range(2):
    model.train()
    for xb, yb in train:
        xb, yb = xb.to(device), yb.to(device)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for xb, yb in val:
            {move}
            correct += (model(xb).argmax(1) == yb).sum().item()
    print("epoch", epoch, "accuracy", correct / 64)
"""
BUGGY = SCRIPT.format(move="pass  # the bug: the validation batch stays on the host")
FIXED = SCRIPT.format(move="xb, yb = xb.to(device), yb.to(device)")


def run(tmp_path, source: str, virtual: bool = True, timeout: float = 120):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items()
           if k not in CLUSTER_VARIABLES and k != "ESYNC_VIRTUAL_DEVICE"}
    env["PYTHONPATH"] = os.pathsep.join([SITE] + [p for p in (env.get("PYTHONPATH"),) if p])
    env["ESYNC_ARGS"] = '["--num-threads", "1"]'
    if virtual:
        env["ESYNC_VIRTUAL_DEVICE"] = "1"
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_script_that_does_not_move_its_validation_batch_fails_under_the_virtual_device(tmp_path):
    proc = run(tmp_path, BUGGY)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: " + SAME_DEVICE), proc.stderr
    assert "cuda:0 and cpu!" in last
    assert "epoch 0" not in proc.stdout  # training ran, the first validation failed
    assert 'in <module>' in proc.stderr and "model(xb)" in proc.stderr


def test_the_fixed_script_runs_under_the_virtual_device(tmp_path):
    proc = run(tmp_path, FIXED)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("accuracy") == 2


def test_without_the_variable_nothing_changes(tmp_path):
    proc = run(tmp_path, BUGGY, virtual=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("accuracy") == 2


def test_a_process_that_never_imports_torch_does_not_load_it(tmp_path):
    proc = run(tmp_path, """
        import sys
        assert "torch" not in sys.modules and "esync_virtual_device" not in sys.modules
        print(sys.modules["sitecustomize"].__file__)
        """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == os.path.join(SITE, "sitecustomize.py")


ESYNC_SCRIPT = """
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import esync

mode = sys.modules["esync_virtual_device"].ACTIVE  # the virtual device is on


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x):
        return self.net(x)


class Labelled(TensorDataset):
    def __init__(self, x, y):
        super().__init__(x, y)
        self.targets = y.tolist()


esync.init()
torch.manual_seed(0)
x = torch.randn(256, 8)
y = (x[:, 0] > 0).long()
train = Labelled(x, y)
model = esync.prepare_model(MLP())
loader = esync.prepare_data_loader(DataLoader(train, batch_size=32, shuffle=True))
opt = esync.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
assert all(mode.on_device(p) for p in model.parameters())
steps = 0
for xb, yb in loader:
    assert mode.on_device(xb) and mode.on_device(yb)  # moved by the prepared loader
    opt.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    esync.report(loss)
    steps += 1
try:
    model(x[:4])  # the virtual device is really checking
except RuntimeError as e:
    assert "same device" in str(e)
else:
    raise AssertionError("a host batch went through the model")
print("steps", steps)
"""


def test_a_script_on_esyncs_api_trains_alone_under_the_virtual_device(tmp_path):
    """prepare_model moves the model with .to(device), the prepared loader its batches:
    nothing of esync's own mixes host and device tensors (alone, -m local)."""
    proc = run(tmp_path, ESYNC_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert "steps 8" in proc.stdout
