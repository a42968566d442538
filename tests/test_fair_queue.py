"""Unit tests of the fair line (router and engine), the key file, and the tokens-per-minute window."""

from __future__ import annotations

import pytest

from onebit.api.auth import KeyInfo, load_key_file, parse_key_line
from onebit.api.limits import TokenWindow
from onebit.engine.block_manager import BlockManager
from onebit.engine.scheduler import Scheduler
from onebit.engine.sequence import Sequence
from onebit.protocol import SamplingParams
from onebit.protocol.fair_queue import FairQueue


def drain(queue: FairQueue) -> list:
    """Every item in pop order."""
    out = []
    while queue:
        out.append(queue.pop())
    return out


def test_one_user_is_first_in_first_out():
    """With one user the line is FIFO, with fair share on or off."""
    for fair in (True, False):
        queue = FairQueue(fair)
        for i in range(6):
            queue.push(i, "solo")
        assert drain(queue) == list(range(6))


def test_priority_orders_within_a_user_only():
    """Lower priority first among one user's items; arrival breaks ties."""
    queue = FairQueue()
    for item, prio in [("a", 5), ("b", 0), ("c", 5), ("d", -1)]:
        queue.push(item, "u", prio)
    assert drain(queue) == ["d", "b", "a", "c"]


def test_front_goes_before_the_same_priority_of_its_user():
    """A preempted or re-routed item goes back before its user's items of equal priority."""
    queue = FairQueue()
    queue.push("later", "u")
    queue.push("back", "u", front=True)
    queue.push("urgent", "u", priority=-1)
    assert drain(queue) == ["urgent", "back", "later"]


def test_a_newcomer_goes_before_a_served_user():
    """Alice has been served; Bob, arriving later, is next."""
    queue = FairQueue()
    for i in range(5):
        queue.push(f"a{i}", "alice")
    queue.pop()
    queue.started("alice")
    queue.charge("alice", 100)
    queue.push("b0", "bob")
    assert queue.pop() == "b0"


def test_fifo_mode_ignores_users():
    """fair=False: one line whatever the user."""
    queue = FairQueue(fair=False)
    for i in range(3):
        queue.push(f"a{i}", "alice")
    queue.charge("alice", 1000)
    queue.push("b0", "bob")
    assert drain(queue) == ["a0", "a1", "a2", "b0"]


def test_backlogged_users_service_converges():
    """Two users always backlogged, one asking 3x bigger requests: each gets about half the tokens."""
    queue = FairQueue()
    cost = {"big": 30, "small": 10}
    for i in range(200):
        queue.push(("big", i), "big")
        queue.push(("small", i), "small")
    served = {"big": 0, "small": 0}
    for _ in range(120):
        user, _ = queue.pop()
        queue.charge(user, cost[user])
        served[user] += cost[user]
    assert abs(served["big"] - served["small"]) <= cost["big"]


def test_idle_time_is_not_banked():
    """A user returning after others were served starts at the current virtual time, not at 0:
    it does not get a long run of turns in a row (without the lift Bob would take 4 turns first)."""
    queue = FairQueue()
    for i in range(10):
        queue.push(("alice", i), "alice")
    for _ in range(5):
        queue.pop()
        queue.charge("alice", 100)
    for i in range(5):
        queue.push(("bob", i), "bob")
    order = []
    for _ in range(4):
        user, _ = queue.pop()
        queue.charge(user, 100)
        order.append(user)
    assert order.count("alice") == 2


def test_remove_and_position():
    """remove() takes an item out; position() counts round robin between users."""
    queue = FairQueue()
    items = {name: [object() for _ in range(3)] for name in ("alice", "bob")}
    for i in range(3):
        queue.push(items["alice"][i], "alice")
    queue.charge("alice", 50)
    for i in range(3):
        queue.push(items["bob"][i], "bob")
    assert queue.position(items["alice"][0]) == 1  # bob joined at alice's virtual time: tie, alice arrived first
    assert queue.position(items["bob"][2]) == 6
    assert queue.remove(items["alice"][1]) and items["alice"][1] not in queue
    assert len(queue) == 5 and queue.waiting_by_user() == {"alice": 2, "bob": 3}


def make_seq(i: int, user: str, prompt: int = 8) -> Sequence:
    """A sequence of `prompt` tokens for `user`."""
    return Sequence(f"r{i}", list(range(1, prompt + 1)), SamplingParams(max_tokens=4), 64, i, user)


def test_engine_admits_the_least_served_user_first():
    """The scheduler's waiting line: Alice's backlog, then one of Bob's: Bob is admitted at the next free slot."""
    scheduler = Scheduler(BlockManager(64, 4), parallel=2, max_batch_tokens=64)
    alice = [make_seq(i, "alice") for i in range(5)]
    for seq in alice:
        scheduler.add(seq)
    plan = scheduler.schedule()
    assert [s.request_id for s, _ in plan] == ["r0", "r1"]
    bob = make_seq(9, "bob")
    scheduler.add(bob)
    scheduler.finish(alice[0])
    plan = scheduler.schedule()
    assert bob in dict(plan)


def test_engine_order_is_fifo_for_one_user():
    """One user: admission in arrival order, as before fair share."""
    scheduler = Scheduler(BlockManager(64, 4), parallel=1, max_batch_tokens=64)
    seqs = [make_seq(i, "solo") for i in range(4)]
    for seq in seqs:
        scheduler.add(seq)
    admitted = []
    for seq in seqs:
        plan = scheduler.schedule()
        admitted += [s.request_id for s, n in plan if n > 1]
        scheduler.finish(seq)
    assert admitted == ["r0", "r1", "r2", "r3"]


def test_priority_preempts_only_with_the_flag():
    """A waiting request with a lower priority value preempts its user's running one when asked."""
    for preempt in (False, True):
        scheduler = Scheduler(BlockManager(64, 4), parallel=1, max_batch_tokens=64, priority_preempt=preempt)
        low = make_seq(0, "u")
        low.priority = 5
        scheduler.add(low)
        scheduler.schedule()
        urgent = make_seq(1, "u")
        scheduler.add(urgent)
        plan = dict(scheduler.schedule())
        assert (urgent in plan) is preempt
        assert (low in scheduler.waiting) is preempt


def test_key_file_lines():
    """KEY NAME [limits]; comments and blanks skipped; bad limits named."""
    assert parse_key_line("  # just a comment", "f") is None
    assert parse_key_line("k1 alice tpm=100 max_queued=2", "f") == ("k1", KeyInfo("alice", None, 2, 100))
    with pytest.raises(ValueError, match="f"):
        parse_key_line("lonely", "f")
    with pytest.raises(ValueError, match="speed=3"):
        parse_key_line("k alice speed=3", "f")
    with pytest.raises(ValueError, match="tpm=0"):
        parse_key_line("k alice tpm=0", "f")


def test_key_file_rejects_a_repeated_key(tmp_path):
    """The same key twice is a mistake worth stopping for."""
    path = tmp_path / "keys"
    path.write_text("k alice\nk bob\n")
    with pytest.raises(ValueError, match="line 2"):
        load_key_file(path)


def test_token_window_forgets_after_a_minute():
    """Tokens leave the window 60 s after they were used; Retry-After says when it is below the limit."""
    window = TokenWindow()
    window.add(30, now=0.0)
    window.add(30, now=20.0)
    assert window.used(30.0) == 60
    assert window.seconds_until_below(50, 30.0) == 30  # the first 30 leave at t=60
    assert window.used(61.0) == 30
