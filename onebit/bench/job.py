"""What every request of a level sends, as plain data, so that a client process can rebuild it.

The parent and its client processes build the same prompt pool from the same seed, so request
i carries the same prompt whichever process sends it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import httpx

from onebit.bench.client import build_payload, stream_request
from onebit.bench.loadgen import Send
from onebit.bench.prompts import DEFAULT_RANDOM_IDS, make_prompts


@dataclass
class LevelJob:
    """The requests of one level: endpoint URL, model, prompt pool and generation settings."""

    url: str  # the full endpoint URL, e.g. http://h:p/v1/completions
    model: str
    endpoint: str  # 'chat' or 'completions'
    prompts: str  # prompt set spec, e.g. 'random:128'
    pool_size: int  # request i uses prompt i modulo this
    seed: int
    max_tokens: int
    extra_body: dict = field(default_factory=dict)
    random_ids: tuple[int, int] = DEFAULT_RANDOM_IDS

    def to_json(self) -> dict:
        """A JSON-able dict; `LevelJob.from_json` reads it back."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> LevelJob:
        """The job a `to_json` dict describes."""
        return cls(**{**data, "random_ids": tuple(data["random_ids"])})

    def sender(self, client: httpx.AsyncClient) -> Send:
        """`send(i)`: stream request i (prompt i modulo the pool) with `client`."""
        pool = make_prompts(self.prompts, self.pool_size, self.endpoint, seed=self.seed, id_range=self.random_ids)

        def send(i: int):
            body = build_payload(pool[i % len(pool)], self.endpoint, self.model, self.max_tokens, self.extra_body)
            return stream_request(client, self.url, body, index=i)

        return send
