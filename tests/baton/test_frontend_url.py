"""baton.frontend.with_password: the Redis password goes into the URL only where the URL has none,
keeping a username, for redis://, rediss:// and unix:// alike, and redis-py reads back what was meant."""

from __future__ import annotations

import pytest
from redis.connection import parse_url

from baton.frontend import with_password


@pytest.mark.parametrize(
    "url,expected",
    [
        ("redis://redis.baton.svc:6379/0", "redis://:pw@redis.baton.svc:6379/0"),
        ("redis://host", "redis://:pw@host"),
        # a username without a password: keep the username, add the password
        ("redis://user@host:6379/0", "redis://user:pw@host:6379/0"),
        ("redis://user:@host:6379/0", "redis://user:pw@host:6379/0"),
        (
            "rediss://default@cache.example.com:6380/2?ssl_cert_reqs=required",
            "rediss://default:pw@cache.example.com:6380/2?ssl_cert_reqs=required",
        ),
        ("redis://[::1]:6379/0", "redis://:pw@[::1]:6379/0"),
        ("unix:///run/redis/redis.sock?db=1", "unix://:pw@/run/redis/redis.sock?db=1"),
    ],
)
def test_password_is_added(url, expected):
    assert with_password(url, "pw") == expected


@pytest.mark.parametrize(
    "url",
    [
        "redis://:secret@host:6379/0",
        "redis://user:secret@host:6379/0",
        "rediss://user:secret@host:6380/0",
        "unix://:secret@/run/redis.sock",
        "unix:///run/redis.sock?password=secret",
        "redis://host:6379/0?password=secret",
    ],
)
def test_a_password_already_in_the_url_wins(url):
    assert with_password(url, "other") == url


@pytest.mark.parametrize("password", [None, ""])
def test_no_password_leaves_the_url_alone(password):
    for url in ("redis://host:6379/0", "redis://user@host:6379/0", "unix:///run/redis.sock"):
        assert with_password(url, password) == url


def test_special_characters_are_quoted_and_read_back_by_redis_py():
    password = "p@ss:w/rd%?#"
    url = with_password("redis://user@host:6379/3", password)
    assert password not in url
    kw = parse_url(url)
    assert (kw["username"], kw["password"], kw["host"], kw["port"], kw["db"]) == ("user", password, "host", 6379, 3)


@pytest.mark.parametrize(
    "url,fields",
    [
        ("redis://host:6379/0", {"host": "host", "port": 6379, "db": 0}),
        ("redis://user@host:6379/0", {"username": "user", "host": "host", "port": 6379, "db": 0}),
        ("rediss://host:6380/1", {"host": "host", "port": 6380, "db": 1}),
        ("unix:///run/redis.sock?db=2", {"path": "/run/redis.sock", "db": 2}),
    ],
)
def test_redis_py_sees_the_password(url, fields):
    kw = parse_url(with_password(url, "s3cret"))
    assert kw["password"] == "s3cret"
    assert {k: kw[k] for k in fields} == fields
