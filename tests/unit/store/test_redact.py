"""Secrets never print: every store URL form (``user:password@`` and libpq's ``?password=``, one host
or several) is redacted in errors, the dashboard, ``status --json``, saved events and CLI output."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

from headrace import Computation, cli
from headrace.dashboard import Dashboard
from headrace.errors import OptionError, StoreError
from headrace.monitor.status import status
from headrace.store import open_store
from headrace.store.redact import redact_url
from headrace.testing import Harness

SECRET = "Sup3rSecretPw"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("url, shown", [
    (f"postgresql://u:{SECRET}@h/db", "postgresql://u:***@h/db"),
    (f"postgresql://u@h/db?sslmode=require&password={SECRET}", "postgresql://u@h/db?sslmode=require&password=***"),
    (f"postgresql://u:{SECRET}@h1:5432,h2:5433/db?password={SECRET}&x=1",
     "postgresql://u:***@h1:5432,h2:5433/db?password=***&x=1"),
    (f"host=h password={SECRET} dbname=d", "host=h password=*** dbname=d"),
    (f"postgresq://u:{SECRET}@h/db", "postgresq://u:***@h/db"),
    (f"u:{SECRET}@h/db", "u:***@h/db"),
    ("sqlite:///x.db", "sqlite:///x.db"),
])
def test_one_redaction_handles_every_url_form(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("url", [
    f"postgresq://u:{SECRET}@h/db",  # a mistyped scheme
    f"postgresql://u:{SECRET}@h",  # no database
    f"postgresql://u:{SECRET}@h1:5432,h2:5433",  # multi-host, no database: redaction itself must not raise
    f"postgresq://u@h/db?password={SECRET}",
    f"postgresql://u@h?password={SECRET}",
])
def test_option_errors_on_a_store_url_never_show_the_password(url: str) -> None:
    with pytest.raises(OptionError) as raised:
        open_store(url)
    assert SECRET not in str(raised.value) and "***" in str(raised.value)


@pytest.mark.parametrize("form", ["authority", "query"])
def test_a_store_that_cannot_be_reached_is_named_without_the_password(form: str) -> None:
    port = _closed_port()
    url = (f"postgresql://u:{SECRET}@127.0.0.1:{port}/db" if form == "authority"
           else f"postgresql://u@127.0.0.1:{port}/db?password={SECRET}")
    with pytest.raises(StoreError, match=r"Cannot connect to the PostgreSQL store: .* \(got '.*\*\*\*.*'\)") as raised:
        open_store(url)
    assert SECRET not in str(raised.value)


class Failing(Computation):
    def process_record(self, ctx: Any, record: Any) -> None:
        if record.value == "boom":
            raise ValueError("boom")
        ctx.state = (ctx.state or 0) + 1


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as e:  # an error page must not show it either
        return bytes(e.read())


@pytest.mark.parametrize("form", ["authority", "query"])
def test_nothing_a_run_shows_contains_the_store_password(postgres_server: Any, form: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    plain = postgres_server.new_database()  # the server trusts its clients: a password is accepted and unused
    scheme, rest = plain.split("://", 1)
    user, host = rest.split("@", 1)
    url = f"{scheme}://{user}:{SECRET}@{host}" if form == "authority" else f"{plain}?password={SECRET}"
    harness = Harness(Failing, store=url, shards=1, on_error="dead_letter")
    harness.process("k", "fine", 1_000)
    harness.process("k", "boom", 2_000)
    seen = [json.dumps(status(url)), *(repr(e) for e in open_store(url).events())]
    board = Dashboard(url).start()
    try:
        seen += [_get(board.url).decode(), _get(board.url + "api/overview").decode(),
                 _get(board.url + "api/key?computation=Failing&key=k").decode()]
    finally:
        board.stop()
    assert cli.main(["status", "--json", "--store", url]) == 0
    cli.main(["state", "Failing", "k", "--store", url])  # it fails (no codec recorded): its error is checked too
    out = capsys.readouterr()
    seen += [out.out, out.err]
    assert any("***" in text for text in seen)  # the URL is shown, redacted
    assert [text for text in seen if SECRET in text] == []


def test_a_url_given_as_bytes_is_redacted_too() -> None:
    with pytest.raises(OptionError, match=r"A store is named by a URL string \(got b'postgresql://u:\*\*\*@h/db'\)"):
        open_store(f"postgresql://u:{SECRET}@h/db".encode())  # type: ignore[arg-type]
