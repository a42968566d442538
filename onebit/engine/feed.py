"""The previous step's sampled ids written into this step's input ids, on the device.

With overlapped steps a decoding sequence's last token is a placeholder when its step is queued: the
token is the one the previous step is still sampling. The runner writes those ids into the step's input
ids on the GPU, so the host never waits for them (`Sequence.fed_row`, `LLMEngine`'s overlap)."""

from __future__ import annotations

import torch

from onebit.engine.transfer import upload


class Feed:
    """Which packed input rows take which of the previous step's sampled ids.

    In the common step every row is a decode of the previous step's batch in the same order: rows
    0..k-1 take ids 0..k-1, one device copy. Otherwise (a batch that changed, prompt chunks among the
    decodes) the row and id lists are uploaded and the ids gathered and scattered through them."""

    def __init__(self, values: torch.Tensor, rows: torch.Tensor | None):
        self.values = values  # the ids, on the device, in the order of `rows`
        self.rows = rows  # packed row indices, or None for rows 0..len(values)-1

    def write_into(self, ids: torch.Tensor) -> None:
        """Overwrite the fed rows of the step's input ids [rows] with their sampled ids."""
        if self.rows is None:
            ids[:self.values.shape[0]].copy_(self.values)
        else:
            ids.index_copy_(0, self.rows, self.values)


def make_feed(rows: list[int], sources: list[int], sampled: torch.Tensor) -> Feed | None:
    """The Feed that gives packed row rows[i] the id at sources[i] of `sampled` (the previous step's ids
    on the device); None when no row is fed."""
    if not rows:
        return None
    if rows == sources == list(range(len(rows))):
        return Feed(sampled[:len(rows)], None)
    device = sampled.device
    return Feed(sampled.index_select(0, upload(sources, torch.long, device)), upload(rows, torch.long, device))
