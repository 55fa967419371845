"""Leader election: one lease in Redis (``forkq:leader``) with an owner token per term.

Contract (lease.lua):

- **acquire**: ``SET forkq:leader <token> PX <ttl>`` only when the key is free (``SET NX``
  in one script that deletes first, so it works on Redis at maxmemory too) with a token
  made fresh for this term (``<identity>:<pid>:<8 hex>``), so no earlier term of the same
  process, nor a paused copy of it, can pass for the holder;
- **renew** / **release**: ``PEXPIRE`` / ``DEL`` only while the key still holds
  our token (compare-and-set in Lua); a failed renewal means the term is over;
- **acting**: the holder acts only while :meth:`Lease.holds` — until the lease's
  TTL, counted from the moment the acquire or last renewal was *sent*, minus a
  safety margin, so it stops before the key can expire. Every script the leader
  runs also checks the token itself (fencing): a leader that was paused past its
  lease and wakes up cannot change anything, even before it notices.

The lease also mirrors the leader's process identity into ``dear-leader``
(Sidekiq's ``ProcessSet#leader``), with the same TTL.
"""

from __future__ import annotations

import logging
import secrets
import time

import redis

from forkq import keys
from forkq.scripts import script

log = logging.getLogger(__name__)

REPLACED = 2  # lease.lua's acquire: taken, after replacing a key of another type
SAFETY_FACTOR = 0.1  # stop acting this share of the TTL before the lease could expire
MIN_SAFETY = 0.5  # ... but at least this many seconds before


class LeaseLostError(Exception):
    """A fenced script found that the caller no longer holds the lease."""


class Lease:
    """This process's side of the election. Build after fork, with the child's own client."""

    def __init__(self, client: redis.Redis, *, identity: str, pid: int, ttl: float) -> None:
        self._redis = client
        self._script = script(client, "lease")
        self.identity = identity
        self._owner = f"{identity}:{pid}"
        self.ttl = ttl
        self.token: str | None = None
        self._valid_until = 0.0  # monotonic

    @property
    def margin(self) -> float:
        """How long before the lease could expire the holder stops acting."""
        return max(MIN_SAFETY, self.ttl * SAFETY_FACTOR)

    def holds(self, now: float) -> bool:
        """Whether we may act at monotonic time ``now`` (the fenced scripts check again)."""
        return self.token is not None and now < self._valid_until

    def acquire(self) -> bool:
        """Try to take the lease for a new term; True if we now hold it."""
        token = f"{self._owner}:{secrets.token_hex(4)}"
        sent = time.monotonic()
        if self._call("acquire", token):
            self.token = token
            self._valid_until = sent + self.ttl - self.margin
            return True
        return False

    def renew(self) -> bool:
        """Extend our term; False (and the term is over) if the lease is no longer ours."""
        if self.token is None:
            return False
        sent = time.monotonic()
        if self._call("renew", self.token):
            self._valid_until = sent + self.ttl - self.margin
            return True
        self.step_down()
        return False

    def release(self) -> None:
        """Hand over: delete the lease if it is still ours, so a follower takes it at once."""
        if self.token is not None:
            token, self.token = self.token, None
            self._call("release", token)

    def step_down(self) -> None:
        """Forget our term without touching Redis (it was lost)."""
        self.token = None
        self._valid_until = 0.0

    def holder_ttl(self) -> float:
        """Seconds until the current lease (anyone's) expires; 0 when there is none."""
        remaining = int(self._redis.pttl(keys.LEADER))
        return max(remaining, 0) / 1000.0

    def _call(self, op: str, token: str) -> bool:
        result = int(self._script(keys=[keys.LEADER, keys.DEAR_LEADER],
                                  args=[op, token, int(self.ttl * 1000), self.identity,
                                        keys.LEADER_RELEASED]))
        if result == REPLACED:
            log.warning("the lease key %r held another type than a string (nobody held the "
                        "lease); replaced it", keys.LEADER)
        return result in (1, REPLACED)


def holder(client: redis.Redis) -> str | None:
    """The token of the current leader's term, or None when nobody leads (also when the key
    holds another type: lease.lua's acquire replaces it)."""
    try:
        value = client.get(keys.LEADER)
    except redis.ResponseError:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else None


def leads(token: str | None, identity: str) -> bool:
    """Whether a term token belongs to a scheduler of the process ``identity``."""
    return token is not None and token.startswith(identity + ":")
