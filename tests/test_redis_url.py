"""redis_url checking and Sentinel URL parsing (pure; no server)."""

from __future__ import annotations

import pytest
import redis
from redis.sentinel import MasterNotFoundError

from forkq import redis_url
from forkq.connection import NotASentinelError, _discovery_error, connect
from forkq.redis_url import SentinelTarget, check, parse_sentinel


def test_the_redis_sentinel_form() -> None:
    url = ("redis+sentinel://us%40r:p%3Ass@10.0.0.1:26380,10.0.0.2,[::1]:26381/mymaster/3"
           "?sentinel_password=sp&sentinel_username=su")
    assert parse_sentinel(url) == SentinelTarget(
        sentinels=[("10.0.0.1", 26380), ("10.0.0.2", 26379), ("::1", 26381)],
        service="mymaster", db=3, username="us@r", password="p:ss",
        sentinel_username="su", sentinel_password="sp")


def test_the_kombu_form() -> None:
    url = ("sentinel://:pw@h1:26379/2;sentinel://h2:26380;sentinel://h3"
           "?master_name=svc&sentinel_password=sp")
    target = parse_sentinel(url)
    assert target.sentinels == [("h1", 26379), ("h2", 26380), ("h3", 26379)]
    assert (target.service, target.db, target.password, target.username) == ("svc", 2, "pw", None)
    assert (target.sentinel_password, target.tls) == ("sp", False)


def test_tls_sentinel_options() -> None:
    target = parse_sentinel("rediss+sentinel://h/s?ssl_ca_certs=/ca.crt&ssl_cert_reqs=required"
                            "&ssl_check_hostname=false")
    assert target.tls
    assert target.tls_options == {"ssl_ca_certs": "/ca.crt", "ssl_cert_reqs": "required",
                                  "ssl_check_hostname": False}


@pytest.mark.parametrize(("url", "problem"), [
    ("redis+sentinel://h1,h2", "needs /service_name[/db]"),
    ("redis+sentinel://h1/svc/x", "database must be a number"),
    ("redis+sentinel://h1/svc/0/extra", "needs /service_name[/db]"),
    ("redis+sentinel:///svc", "at least one sentinel"),
    ("redis+sentinel://h1:99999/svc", "port must be 1-65535"),
    ("redis+sentinel://:7/svc", "has no host"),
    ("redis+sentinel://h1/svc?ssl_ca_certs=/x", "TLS options need rediss://"),
    ("redis+sentinel://h1/svc?master_nme=x", "unknown option 'master_nme'"),
    ("sentinel://h1:26379", "add ?master_name=<service>"),
    ("sentinel://h1?master_name=a;sentinel://h2?master_name=b", "given twice"),
    ("sentinel://h1;redis://h2?master_name=a", "must be a sentinel:// URL"),
    ("rediss+sentinel://h/s?ssl_cert_reqs=always", "ssl_cert_reqs must be one of"),
    ("redis://h/0?ssl_ca_certs=/ca", "TLS options need rediss://"),
    ("rediss://h/0?ssl_check_hostname=maybe", "ssl_check_hostname must be true or false"),
    ("rediss://h/0?ssl_ca_cert=/ca", "unknown option 'ssl_ca_cert'"),
    ("redis://h/0?protocol=3", "unknown option 'protocol'"),
    ("http://h/0", "expected 'embedded' or a redis://"),
])
def test_bad_urls_say_what_is_wrong(url: str, problem: str) -> None:
    with pytest.raises(ValueError) as failed:
        check(url)
    assert problem in str(failed.value)
    with pytest.raises(ValueError):
        connect(url)  # the factory refuses it too, before connecting


@pytest.mark.parametrize("url", [
    "redis://:pw@h:6379/0?socket_timeout=3",
    "rediss://h/0?ssl_ca_certs=/ca&ssl_certfile=/c&ssl_keyfile=/k&ssl_cert_reqs=optional",
    "unix:///run/redis.sock?db=2",
    "redis+sentinel://h1,h2:26380/svc",
])
def test_good_urls_pass(url: str) -> None:
    check(url)
    assert redis_url.is_sentinel(url) == ("sentinel" in url)


def test_a_failed_sentinel_discovery_names_its_cause_in_order() -> None:
    """A refused user or command first (exit 77), then a server that is no sentinel (78),
    else no sentinel knew the service."""
    denied = redis.exceptions.NoPermissionError("NOPERM no permissions to run 'sentinel'")
    wrong = redis.AuthenticationError("WRONGPASS")
    plain = redis.ResponseError("unknown command 'SENTINEL'")
    error = _discovery_error("svc", ["a:1", "b:2"], [("b:2", denied)], [("a:1", plain)])
    assert isinstance(error, redis.exceptions.NoPermissionError)
    assert str(error).startswith("a sentinel (b:2) denied sentinel_username the SENTINEL")
    error = _discovery_error("svc", ["a:1"], [("a:1", wrong)], [])
    assert isinstance(error, redis.AuthenticationError) and "sentinel_password" in str(error)
    error = _discovery_error("svc", ["a:1", "b:2"], [], [("a:1", plain)])
    assert isinstance(error, NotASentinelError)
    assert "(a:1) answered SENTINEL with unknown command 'SENTINEL'" in str(error)
    error = _discovery_error("svc", ["a:1", "b:2"], [], [])
    assert isinstance(error, MasterNotFoundError)
    assert "no sentinel (a:1, b:2) named a master for service 'svc'" in str(error)
