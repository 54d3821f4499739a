"""esync.comm.statefile: optimizer and scheduler state saved as safetensors + JSON, without pickle.

1. AdamW (two parameter groups) with OneCycleLR, saved after a few steps and loaded into
   fresh copies: the original and the restored copies, stepped on the same gradients,
   stay exactly equal (parameters, optimizer state, param_groups, learning rates).
2. SGD with StepLR, SequentialLR, ChainedScheduler, ReduceLROnPlateau, LambdaLR (a plain
   lambda), CyclicLR: the round trip gives back each state_dict exactly.
3. Hypothesis: any nested structure of the allowed kinds comes back exactly (key types and
   order, tuples, inf/nan, tensors bit for bit with their dtype and shape).
4. Errors: a function -> ValueError naming its path; a broken pair -> one-line UserError
   naming the file.
"""
import json
import math
import os
import tempfile
from collections import Counter, OrderedDict, defaultdict

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.optim import lr_scheduler as sched

from esync.errors import UserError
from esync.comm.statefile import exists, load_state, save_state


def same(a, b, where="state"):
    """Asserts that `a` and `b` are exactly equal: the same types (tuple is not list, int
    is not float), keys in the same order, floats bit for bit (nan equal to nan), tensors
    of the same dtype, shape and bytes."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), where
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), \
            where
    elif isinstance(a, dict):
        assert [(type(k), k) for k in a] == [(type(k), k) for k in b], where
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                     math.copysign(1, b)), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def round_trip(tmp_path, state, name="s"):
    path = str(tmp_path / name)
    save_state(path, state)
    assert exists(path)
    return load_state(path)


# --- 1. AdamW + OneCycleLR continue exactly -------------------------------------------------
def adamw_setup(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=0.01)
    scheduler = sched.OneCycleLR(opt, max_lr=[0.05, 0.02], total_steps=20)
    return model, opt, scheduler


def grads(model, step):
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(5, 4, generator=g), torch.randn(5, 2, generator=g)
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_adamw_onecycle_resumes_exactly(tmp_path):
    model, opt, scheduler = adamw_setup(0)
    for step in range(4):
        grads(model, step)
        opt.step()
        scheduler.step()
    path = str(tmp_path / "worker-0")
    save_state(path, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                      "scheduler": scheduler.state_dict()})

    loaded = load_state(path)
    assert isinstance(loaded["optimizer"]["param_groups"][0]["betas"], tuple)
    assert list(loaded["optimizer"]["state"]) == [0, 1, 2, 3]  # int keys stay ints
    model2, opt2, scheduler2 = adamw_setup(1)  # other initial weights: all comes from the file
    model2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["optimizer"])
    scheduler2.load_state_dict(loaded["scheduler"])

    for step in range(4, 10):
        g = grads(model, step)
        for p, p2, gi in zip(model.parameters(), model2.parameters(), g):
            p2.grad = gi.clone()
        for o, s in ((opt, scheduler), (opt2, scheduler2)):
            o.step()
            s.step()
    same(list(model2.parameters()), list(model.parameters()))
    same(opt2.state_dict()["state"], opt.state_dict()["state"])
    same(opt2.param_groups[0]["betas"], opt.param_groups[0]["betas"])  # a tuple in both
    for g1, g2 in zip(opt.param_groups, opt2.param_groups):
        same({k: v for k, v in g2.items() if k != "params"},
             {k: v for k, v in g1.items() if k != "params"})
    same(scheduler2.get_last_lr(), scheduler.get_last_lr())
    same(scheduler2.state_dict(), scheduler.state_dict())


# --- 2. schedulers' state_dicts round trip ----------------------------------------------------
def sgd():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def make_schedulers(opt):
    return {
        "step": lambda: sched.StepLR(opt, step_size=2, gamma=0.5),
        "sequential": lambda: sched.SequentialLR(
            opt, [sched.LinearLR(opt, start_factor=0.1, total_iters=3),
                  sched.CosineAnnealingLR(opt, T_max=5)], milestones=[3]),
        "chained": lambda: sched.ChainedScheduler(
            [sched.ExponentialLR(opt, gamma=0.9), sched.MultiStepLR(opt, milestones=[2, 4])]),
        "plateau": lambda: sched.ReduceLROnPlateau(opt, patience=1),
        "lambda": lambda: sched.LambdaLR(opt, lambda epoch: 0.9 ** epoch),
        "cyclic": lambda: sched.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=2),
    }


@pytest.mark.parametrize("kind", list(make_schedulers(None)))
def test_scheduler_round_trip(tmp_path, kind):
    model, opt = sgd()
    scheduler = make_schedulers(opt)[kind]()
    for step in range(6):
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        scheduler.step(*([1.0] if kind == "plateau" else []))  # no progress: lr drops
    state = {"optimizer": opt.state_dict(), "scheduler": scheduler.state_dict()}
    loaded = round_trip(tmp_path, state)
    same(loaded, state)
    model2, opt2 = sgd()
    scheduler2 = make_schedulers(opt2)[kind]()
    opt2.load_state_dict(loaded["optimizer"])
    scheduler2.load_state_dict(loaded["scheduler"])
    same(scheduler2.state_dict(), scheduler.state_dict())
    same(opt2.state_dict(), opt.state_dict())


def test_shared_and_strided_tensors_save(tmp_path):
    w = torch.randn(4, 3)
    state = {"a": w, "tied": w, "view": w[1:3], "t": w.t(), "p": torch.nn.Parameter(w)}
    loaded = round_trip(tmp_path, state)
    for k in state:
        assert torch.equal(loaded[k], state[k].detach()), k
    assert loaded["t"].shape == (3, 4)


def test_any_dtype_and_device(tmp_path):
    state = {"c128": torch.tensor([1 + 2j, -3j], dtype=torch.complex128),
             "u16": torch.tensor([[7]], dtype=torch.uint16), "scalar": torch.tensor(2.5)}
    save_state(str(tmp_path / "s"), state)
    loaded = load_state(str(tmp_path / "s"), device="cpu")
    same(loaded, state)
    assert loaded["scalar"].device == torch.device("cpu")
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # no temporaries left


# --- 3. property: any allowed structure comes back exactly ------------------------------------
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))  # [] is 0-dim; a 0 is empty
    n = math.prod(shape) * dtype.itemsize
    raw = bytearray(draw(st.binary(min_size=n, max_size=n)))
    if dtype == torch.bool:
        raw = bytearray(b % 2 for b in raw)
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)  # any bits


KEYS = st.one_of(st.text(max_size=6), st.integers(-3, 3))
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
                   st.sampled_from([math.inf, -math.inf, math.nan, -0.0]),
                   st.text(max_size=8), tensors())
TREES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
    st.dictionaries(KEYS, inner, max_size=4),
    st.dictionaries(KEYS, inner, max_size=3).map(OrderedDict),
    st.dictionaries(KEYS, inner, max_size=3).map(Counter)), max_leaves=16)


@settings(max_examples=80, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.dictionaries(KEYS, TREES, max_size=5))
def test_any_structure_round_trips(state):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "s")
        save_state(path, state)
        same(load_state(path), state)


# --- 4. errors ---------------------------------------------------------------------------------
def test_function_raises_value_error_naming_its_path(tmp_path):
    path = str(tmp_path / "s")
    with pytest.raises(ValueError, match=r"^state\['scheduler'\]\['lr_lambdas'\]\[0\]: "
                                         r"a function cannot be saved"):
        save_state(path, {"scheduler": {"lr_lambdas": [lambda e: e], "x": 1}})
    with pytest.raises(ValueError, match=r"^state\[3\]\[1\]: an object of type object "):
        save_state(path, {3: (1, object())})
    with pytest.raises(ValueError, match=r"^state: a key 1.5 \(float\)"):
        save_state(path, {1.5: 0})
    with pytest.raises(ValueError, match=r"^state\['d'\]: a defaultdict cannot be saved"):
        save_state(path, {"d": defaultdict(list)})
    assert not os.listdir(tmp_path)  # nothing written


def one_line_user_error(path, file):
    with pytest.raises(UserError) as e:
        load_state(path)
    message = str(e.value)
    assert message.startswith(file + ":") and "\n" not in message, message
    assert "Traceback" not in message
    return message


def test_broken_pairs_raise_one_line_user_errors(tmp_path):
    path = str(tmp_path / "s")
    state = {"w": torch.arange(1000.0), "step": 3}
    js, st_ = path + ".json", path + ".safetensors"

    save_state(path, state)
    os.remove(js)
    assert not exists(path)
    one_line_user_error(path, js)

    save_state(path, state)
    os.remove(st_)
    assert not exists(path)
    assert "missing" in one_line_user_error(path, st_)

    save_state(path, state)
    with open(st_, "r+b") as f:
        f.truncate(os.path.getsize(st_) // 2)
    one_line_user_error(path, st_)

    save_state(path, state)
    with open(st_, "r+b") as f:
        f.truncate(3)  # not even a header length
    one_line_user_error(path, st_)

    save_state(path, state)
    with open(js, "w") as f:
        f.write("{not json")
    assert "not JSON" in one_line_user_error(path, js)

    for doc in ([1, 2], {"format": "esync-state", "version": 1, "pair": "00",
                         "state": {"dict": [[0, 1]]}}):
        save_state(path, state)
        with open(js, "w") as f:
            json.dump(doc, f)
        one_line_user_error(path, doc == [1, 2] and js or st_)  # wrong pair: the tensors'

    save_state(path, state)
    doc = json.load(open(js))
    doc["state"] = {"dict": [["w", {"tensor": "99"}]]}  # names no tensor of the file
    with open(js, "w") as f:
        json.dump(doc, f)
    one_line_user_error(path, js)

    save_state(path, state)  # another save's tensors beside this JSON
    other = str(tmp_path / "other")
    save_state(other, state)
    os.replace(other + ".safetensors", st_)
    assert "not the tensors of" in one_line_user_error(path, st_)
