"""Samples of a sharded data set as a torch Dataset: parts decoded into tensors.

`ShardDataset(folder, split)` is what `--dataset shards:DIR` trains and evaluates, and
what a user's script hands to `esync.prepare_data_loader` (in a DataLoader, with its
own `num_workers`): the prepared loader then reads it block by block (esync.data.blocks)
and hands the samples' bytes to the DataLoader's worker processes, which decode them
here. `dataset[i]` alone reads sample i by itself (evaluation, checks).

Decoding by the index's parts: an image (Pillow; grayscale stays one channel, anything
else becomes RGB) is scaled to [0, 1] and normalised with mean 0.5 and std 0.5; a
`.npy` array (never unpickled) becomes a tensor; the target is the `.cls` integer, or,
where the index names no target, the input is a token window: (window[:-1],
window[1:]). `decode=` replaces all of this with a function of the sample's
{extension: bytes} returning (input, target); `transform=` is applied to the input.
"""
from __future__ import annotations

import io
from typing import Any, Callable, Dict, Optional, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from esync.data.shards import IMAGE_PARTS, ShardSet
from esync.errors import UserError

Parts = Dict[str, bytes]


class ShardDataset(Dataset):
    """Split `split` of the shards in `folder` (see the module)."""

    def __init__(self, folder: str, split: str = "train",
                 transform: Optional[Callable[[Any], Any]] = None,
                 decode: Optional[Callable[[Parts], Tuple[Any, Any]]] = None):
        self.shards = ShardSet(folder, split)
        self.folder, self.split = folder, split
        self.transform, self.decode = transform, decode
        self.classes = self.shards.classes
        labels = self.shards.labels
        #: one label per sample (from the index), for -s 1's split by class
        self.targets = labels.tolist() if labels is not None else None

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, item: Union[int, Tuple[int, Parts]]) -> Tuple[Any, Any]:
        """Sample `item` (an index), or a sample already read: (id, {extension: bytes})."""
        if isinstance(item, tuple):
            sample_id, parts = item
        else:
            sample_id = int(item)
            parts = self.shards.read(sample_id, 1)[0][1]
        try:
            inputs, target = (self.decode or self._decode)(parts)
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"{self.shards.files[self.shards.shard_of(sample_id)].path}: "
                            f"sample {sample_id} cannot be decoded: {type(e).__name__}: "
                            f"{e}") from None
        if self.transform is not None:
            inputs = self.transform(inputs)
        return inputs, target

    def _decode(self, parts: Parts) -> Tuple[Any, Any]:
        part, target = self.shards.input, self.shards.target
        if part not in parts:
            raise UserError(f"a sample of {self.folder} has no .{part} part (it has "
                            f"{', '.join('.' + p for p in parts)})")
        inputs = decode_part(part, parts[part])
        if target is None:  # a token window: predict each next token
            return inputs[:-1].long(), inputs[1:].long()
        if target not in parts:
            raise UserError(f"a sample of {self.folder} has no .{target} part")
        return inputs, decode_part(target, parts[target])


def decode_part(ext: str, data: bytes) -> Any:
    """One part's bytes as a value: an image or array as a tensor, a class as an int."""
    if ext in IMAGE_PARTS:
        from PIL import Image

        from esync.data.formats import _normalize  # as the image folder reader's

        with Image.open(io.BytesIO(data)) as image:
            image = image.convert("L" if image.mode in ("1", "L", "I;16", "I") else "RGB")
            pixels = torch.from_numpy(np.array(image, dtype=np.uint8))
        return _normalize(pixels.unsqueeze(0) if pixels.dim() == 2 else pixels.permute(2, 0, 1))
    if ext == "npy":
        array = np.load(io.BytesIO(data), allow_pickle=False)
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        return tensor.float() if tensor.is_floating_point() else tensor
    if ext in ("cls", "label", "index"):
        return int(data.decode("ascii").strip())
    if ext in ("txt", "text"):
        return data.decode("utf-8")
    if ext == "json":
        import json

        return json.loads(data)
    raise UserError(f"no decoder for .{ext} parts: pass decode= to ShardDataset")
