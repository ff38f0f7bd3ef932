"""bench.short_behind_long over a real loopback HTTP server (the scripted FakeRouter)."""

from __future__ import annotations

import json

import pytest

from bench.short_behind_long import main
from router.http.app import create_app
from router.http.server import ThreadedHttpServer
from tests.router.fake_router import FakeRouter


def test_it_reports_every_prompt_s_time_to_first_token(tmp_path, capsys) -> None:
    srv = ThreadedHttpServer(
        create_app(FakeRouter(max_model_len=1000, token_delay_s=0.002), served_model_name="fake"), "127.0.0.1", 0
    ).start()
    try:
        out = tmp_path / "r.json"
        assert (
            main(
                [
                    "--url",
                    srv.url,
                    "--long",
                    "0,3",
                    "--short",
                    "2",
                    "--long-tokens",
                    "20",
                    "--delay",
                    "0.05",
                    "--json",
                    str(out),
                ]
            )
            == 0
        )
    finally:
        srv.stop()
    runs = json.loads(out.read_text())["runs"]
    assert [r["long"] for r in runs] == [0, 3]
    assert [len(r["long_ttft_s"]) for r in runs] == [0, 3] and all(len(r["short_ttft_s"]) == 2 for r in runs)
    assert all(r["refused"] == 0 and 0 < r["short_ttft_max_s"] < 5 for r in runs)
    assert "3 long: short TTFT ms" in capsys.readouterr().out


def test_bad_arguments_are_named() -> None:
    with pytest.raises(SystemExit):
        main(["--url", "http://x", "--long", "a,b"])
    with pytest.raises(SystemExit):
        main(["--url", "http://x", "--short", "0"])
