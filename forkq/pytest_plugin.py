"""forkq's pytest plugin: the ``forkq_fake`` and ``forkq_inline`` fixtures.

Installed with forkq (entry point ``pytest11``, plugin name ``forkq``; ``-p no:forkq``
turns it off). Each fixture switches a :mod:`forkq.testing` mode on for one test and off
after it, also when the test fails.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from forkq import testing


@pytest.fixture
def forkq_fake() -> Iterator[testing.Fake]:
    """Fake mode for this test: pushes are kept in memory (``.jobs()``, ``.scheduled()``,
    ``.clear()``) and run by ``.drain()``; nothing reaches Redis."""
    with testing.fake() as queues:
        yield queues


@pytest.fixture
def forkq_inline() -> Iterator[testing.Inline]:
    """Inline mode for this test: every push runs its job at once, in the test's process."""
    with testing.inline() as mode:
        yield mode
