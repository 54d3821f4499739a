"""Optimizer and learning-rate scheduler state saved without pickle, and a worker's own
state at the job's checkpoints kept that way (`WorkerState`).

A worker's `optimizer.state_dict()` and each scheduler's `state_dict()` are nested dicts,
lists and tuples of tensors, numbers, strings and None. `torch.save` would pickle them, and
unpickling a file can run any code, so this module writes them as a pair of files instead:

- `<path>.safetensors`: every tensor, under the names "0", "1"...;
- `<path>.json`: the structure, with each tensor replaced by its name, e.g.

      {"format": "esync-state", "version": 1, "pair": "9f0c...",
       "state": {"dict": [["state", {"dict": [[0, {"dict": [["step", {"tensor": "0"}]]}]]}],
                          ["betas", {"tuple": [0.9, 0.999]}],
                          ["best", {"float": "inf"}], ["lr_lambdas", [null]]]}}

  A JSON object is always one of these tags ("dict", "OrderedDict", "Counter": a list of
  [key, value] pairs, so that int keys stay ints; "tuple"; "tensor", with "dtype" and
  "shape" for a dtype that safetensors lacks, stored as bytes; "float" for inf, -inf and
  nan, which JSON lacks);
  lists, str, int, finite floats, bools and null are written as themselves.

The JSON is written last, and an older JSON is removed before the tensors are replaced, so
that a JSON file present means a complete pair; "pair" is also stored in the safetensors file
and checked on load, so that tensors from another save are never mixed in.
"""
import json
import logging
import math
import os
import re
import secrets
from collections import Counter, OrderedDict
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from esync.comm.checkpoint import fsync as _fsync
from esync.errors import UserError

FORMAT, VERSION, PAIR = "esync-state", 1, "pair"
#: dtypes that safetensors stores as themselves; any other dtype travels as its bytes
NATIVE = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
          torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}
DICTS = {"dict": dict, "OrderedDict": OrderedDict, "Counter": Counter}
KINDS = "only dicts, lists, tuples, tensors, bool, int, float, str and None can"

log = logging.getLogger(__name__)


def save_state(path: str, state: Dict[Any, Any]) -> None:
    """Write `state` as `<path>.safetensors` and `<path>.json`, each atomically (a temporary
    file in the same folder, then `os.replace`). Raises ValueError, naming where in `state`,
    for anything but the kinds above, before touching any file."""
    tensors: Dict[str, torch.Tensor] = {}
    tree = _encode(state, "state", tensors, set())
    token = secrets.token_hex(8)
    tensors[PAIR] = torch.tensor(list(bytes.fromhex(token)), dtype=torch.uint8)
    doc = json.dumps({"format": FORMAT, "version": VERSION, PAIR: token, "state": tree},
                     allow_nan=False)
    tmp_st, tmp_js = f"{path}.safetensors.{token}.tmp", f"{path}.json.{token}.tmp"
    try:
        save_file(tensors, tmp_st)
        with open(tmp_js, "w", encoding="utf-8") as f:
            f.write(doc)
        _fsync(tmp_st)
        _fsync(tmp_js)
        if os.path.exists(path + ".json"):  # no moment where an old JSON meets new tensors
            os.remove(path + ".json")
        os.replace(tmp_st, path + ".safetensors")
        os.replace(tmp_js, path + ".json")
        _fsync(os.path.dirname(os.path.abspath(path)))  # the renames themselves
    finally:
        for name in (tmp_st, tmp_js):
            if os.path.exists(name):
                os.remove(name)


def load_state(path: str, device: Optional[Union[str, torch.device]] = None) -> Dict[Any, Any]:
    """The structure that `save_state(path, ...)` wrote, its tensors on `device` (else the CPU).
    Raises UserError, one line naming the file, for a missing, truncated or malformed pair."""
    js, st = path + ".json", path + ".safetensors"
    try:
        with open(js, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise UserError(f"{js}: cannot read the state file ({e.strerror})") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise UserError(f"{js}: not JSON ({_line(e)})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise UserError(f"{js}: not a state file of esync (format {FORMAT!r}, "
                        f"version {VERSION} expected)")
    try:
        tensors = load_file(st)
    except FileNotFoundError:
        raise UserError(f"{st}: missing (its pair {js} is there)") from None
    except (OSError, SafetensorError, RuntimeError, ValueError) as e:
        raise UserError(f"{st}: not a valid safetensors file ({_line(e)})") from None
    pair = tensors.pop(PAIR, None)
    if pair is None or pair.dtype != torch.uint8 or bytes(pair.reshape(-1).tolist()).hex() \
            != doc.get(PAIR):
        raise UserError(f"{st}: not the tensors of {js} (another save's, or a save interrupted)")
    try:
        return _decode(doc.get("state"), tensors, device)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise UserError(f"{js}: malformed state ({_line(e)})") from None


def exists(path: str) -> bool:
    """Whether a complete pair `<path>.json` and `<path>.safetensors` is there."""
    return os.path.isfile(path + ".json") and os.path.isfile(path + ".safetensors")


def _line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _encode(x: Any, where: str, tensors: Dict[str, torch.Tensor], storages: set) -> Any:
    if x is None or isinstance(x, bool):  # bool before int, which it is a subclass of
        return x
    if isinstance(x, str):
        return str(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x) if math.isfinite(x) else {"float": repr(float(x))}
    if isinstance(x, torch.Tensor):
        return _encode_tensor(x, where, tensors, storages)
    if isinstance(x, (list, tuple)):
        items = [_encode(v, f"{where}[{i}]", tensors, storages) for i, v in enumerate(x)]
        return {"tuple": items} if isinstance(x, tuple) else items
    if isinstance(x, dict):
        tag = {kind: tag for tag, kind in DICTS.items()}.get(type(x))
        if tag is None:  # a defaultdict's factory, say, would be lost
            raise ValueError(f"{where}: a {type(x).__name__} cannot be saved "
                             "(only dict, OrderedDict and Counter among the mappings)")
        pairs = []
        for k, v in x.items():
            if type(k) not in (str, int):
                raise ValueError(f"{where}: a key {k!r} ({type(k).__name__}) cannot be saved "
                                 "(only str and int keys can)")
            pairs.append([k, _encode(v, f"{where}[{k!r}]", tensors, storages)])
        return {tag: pairs}  # MultiStepLR's milestones are a Counter, and must stay one
    what = "a function" if callable(x) else f"an object of type {type(x).__name__}"
    raise ValueError(f"{where}: {what} cannot be saved ({KINDS}; {x!r:.60})")


def _encode_tensor(t: torch.Tensor, where: str, tensors: Dict[str, torch.Tensor],
                   storages: set) -> Dict[str, Any]:
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        raise ValueError(f"{where}: a {t.layout} {t.device.type} tensor cannot be saved "
                         "(only dense tensors with data can)")
    t = t.detach().cpu().resolve_conj().resolve_neg()  # a lazy conj() view: its values
    ptr = t.untyped_storage().data_ptr()
    if not t.is_contiguous() or (ptr and ptr in storages):  # safetensors refuses shared memory
        t = t.clone(memory_format=torch.contiguous_format)
    storages.add(t.untyped_storage().data_ptr())
    name = str(len(tensors))
    if t.dtype in NATIVE:
        tensors[name] = t
        return {"tensor": name}
    tensors[name] = t.reshape(-1).view(torch.uint8)
    return {"tensor": name, "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}


def _decode(x: Any, tensors: Dict[str, torch.Tensor], device: Any) -> Any:
    if isinstance(x, list):
        return [_decode(v, tensors, device) for v in x]
    if not isinstance(x, dict):
        return x
    tag = next(iter(x), None)
    if tag in DICTS and len(x) == 1:
        out = DICTS[tag]()
        for k, v in x[tag]:
            if type(k) not in (str, int):
                raise ValueError(f"key {k!r} is neither str nor int")
            out[k] = _decode(v, tensors, device)
        return out
    if "tuple" in x and len(x) == 1 and isinstance(x["tuple"], list):
        return tuple(_decode(v, tensors, device) for v in x["tuple"])
    if "float" in x and len(x) == 1 and x["float"] in ("inf", "-inf", "nan"):
        return float(x["float"])
    if "tensor" in x and set(x) <= {"tensor", "dtype", "shape"}:
        t = tensors[x["tensor"]]
        if "dtype" in x:
            dtype = getattr(torch, x["dtype"], None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown dtype {x['dtype']!r}")
            t = t.view(dtype).reshape(x["shape"])
        return t if device is None else t.to(device)
    raise ValueError(f"unknown tag {sorted(x)}")


class WorkerState:
    """A worker's own state at the job's checkpoints: its optimizers' and prepared
    learning-rate schedulers' `state_dict()`s (in the order the script made them), its
    counts of local iterations and samples, and the model's integer buffers (BatchNorm's
    num_batches_tracked, each worker's own), as of the end of round n, kept in
    CHECKPOINT_DIR/worker<rank>/round-<n>.{json,safetensors} (save_state: no pickle)
    when the servers checkpoint the model at round n, so that a resumed job goes on with
    Adam's moments and the schedule where they were. The newest `keep` are kept. Without
    a folder it keeps nothing (and a resumed job finds nothing)."""

    def __init__(self, folder: Optional[str] = None, rank: int = 0, keep: int = 3):
        self.path = os.path.join(folder, f"worker{rank}") if folder else None
        self.rank, self.keep = rank, keep
        self.stateful: List[Tuple[str, Any]] = []  # ("optimizer" or "scheduler", it)
        self.pending: List[int] = []  # checkpoint rounds whose state is not kept yet
        self.resumed: Optional[Dict[str, Any]] = None  # the state the job goes on with

    def add(self, kind: str, thing: Any) -> None:
        """Keep `thing`'s state (an optimizer or a prepared scheduler: `kind`); resuming,
        give it back the state it had at the checkpoint the job goes on from (and the
        optimizers theirs again after a scheduler's: a scheduler made sets the learning
        rate it starts at)."""
        self.stateful.append((kind, thing))
        if self.resumed is None:
            return
        index = sum(1 for k, _ in self.stateful if k == kind) - 1
        saved = self.resumed.get(f"{kind}s", [])
        if index >= len(saved):
            log.warning("resuming: no %s state was kept for this worker's %s number %d; it "
                        "starts afresh", kind, kind, index + 1)
            return
        thing.load_state_dict(saved[index])
        if kind == "scheduler":
            optimizers = [o for k, o in self.stateful if k == "optimizer"]
            for optimizer, state in zip(optimizers, self.resumed.get("optimizers", [])):
                optimizer.load_state_dict(state)

    def keep_pending(self, counts: Dict[str, Any], integers: Dict[str, Any]) -> None:
        """The state of each checkpoint round pending, as the script's loop leaves it now
        (`counts`: the session's iterations and samples; `integers`: the model's integer
        buffers)."""
        rounds, self.pending = self.pending, []
        if self.path is None:
            return
        for round_ in rounds:
            state = {"round": round_, **counts, "counts": dict(integers),
                     "optimizers": [t.state_dict() for k, t in self.stateful if k == "optimizer"],
                     "schedulers": [t.state_dict() for k, t in self.stateful if k == "scheduler"]}
            try:
                os.makedirs(self.path, exist_ok=True)
                save_state(os.path.join(self.path, f"round-{round_}"), state)
            except OSError as e:
                raise UserError(f"--checkpoint-dir: cannot write worker {self.rank}'s state "
                                f"in {self.path}: {e.strerror}") from None
            for old in self.rounds()[:-self.keep]:
                for suffix in (".json", ".safetensors"):
                    try:
                        os.remove(os.path.join(self.path, f"round-{old}{suffix}"))
                    except OSError:
                        pass

    def rounds(self) -> List[int]:
        try:
            names = os.listdir(self.path) if self.path else []
        except OSError:
            return []
        found = (re.fullmatch(r"round-(\d{1,12})\.json", name) for name in names)
        return sorted(int(m.group(1)) for m in found if m)

    def take_back(self, round_: int, integers: Dict[str, Any]) -> Dict[str, Any]:
        """Resuming from round `round_`: the newest state kept at or before it (a damaged
        one is skipped with a warning), given back as the optimizers and schedulers are
        made; the model's integer buffers now; returns the counts it had ({} if none)."""
        for kept in sorted((r for r in self.rounds() if r <= round_), reverse=True):
            try:
                self.resumed = load_state(os.path.join(self.path, f"round-{kept}"))
            except UserError as e:
                log.warning("[worker %d] skipping a damaged state: %s", self.rank, e)
                continue
            if kept != round_:
                log.warning("resuming from round %d: worker %d's optimizer and scheduler "
                            "state is of round %d, the newest kept", round_, self.rank, kept)
            for name, value in (self.resumed.get("counts") or {}).items():
                mine = integers.get(name)
                if mine is not None and getattr(value, "shape", None) == mine.shape:
                    mine.copy_(value)
            return {k: self.resumed[k] for k in ("iterations", "samples")
                    if isinstance(self.resumed.get(k), int)}
        log.warning("resuming from round %d: no optimizer or scheduler state was kept for "
                    "worker %d (in %s); they start afresh", round_, self.rank, self.path)
        return {}
