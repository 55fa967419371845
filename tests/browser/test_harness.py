"""The browser harness itself: without Debian's chromium the browser tests fail, saying
what to install (they never skip)."""

from __future__ import annotations

import pytest

from . import harness


@pytest.mark.parametrize("missing", ["CHROMIUM", "CHROMEDRIVER"])
def test_a_missing_browser_fails_saying_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                        missing: str) -> None:
    monkeypatch.setattr(harness, missing, "/nonexistent/chromium-or-driver")
    asked: list[tuple[str, ...]] = []  # as root on Debian it would apt-get them first
    monkeypatch.setattr(harness.debian, "install", lambda *packages: asked.append(packages))
    with pytest.raises(harness.BrowserMissingError) as raised:
        harness.chromium()
    assert isinstance(raised.value, AssertionError), "a failure, not a skip"
    message = str(raised.value)
    assert "/nonexistent/chromium-or-driver not found" in message
    assert "apt-get install chromium chromium-driver" in message
    assert asked == [("chromium", "chromium-driver")]
