"""The previous step's sampled ids written into a step's input ids (`onebit.engine.feed`)."""

from __future__ import annotations

import torch

from onebit.engine.feed import make_feed


def test_rows_that_kept_their_order_take_the_ids_in_one_copy():
    sampled = torch.tensor([40, 41, 42, 43])
    feed = make_feed([0, 1, 2], [0, 1, 2], sampled)
    assert feed.rows is None and feed.values.data_ptr() == sampled.data_ptr()  # a view: no gather
    ids = torch.full((6,), -1)
    feed.write_into(ids)
    assert ids.tolist() == [40, 41, 42, -1, -1, -1]


def test_reordered_or_chunked_rows_are_gathered_and_scattered():
    sampled = torch.tensor([40, 41, 42, 43])
    ids = torch.full((6,), -1)
    feed = make_feed([0, 1, 4], [2, 0, 3], sampled)  # a batch that changed, a prompt chunk among the rows
    assert feed.rows is not None
    feed.write_into(ids)
    assert ids.tolist() == [42, 40, -1, -1, 43, -1]
    same_rows_other_ids = make_feed([0, 1], [1, 0], sampled)
    assert same_rows_other_ids.rows is not None
    same_rows_other_ids.write_into(ids)
    assert ids.tolist()[:2] == [41, 40]


def test_no_fed_row_is_no_feed():
    assert make_feed([], [], torch.tensor([1, 2])) is None
