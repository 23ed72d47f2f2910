"""The metrics server's errors (services/metrics/server.py): a scraper that hangs up mid-answer (its
scrape_timeout passed on a loaded machine) is one debug line, not a traceback on the command's
stderr; a handler's own bug is one logged error, not socketserver's print."""

from __future__ import annotations

import logging

import pytest

from services.metrics.server import serve_early


@pytest.mark.parametrize("gone", [BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")])
def test_a_client_that_went_away_is_a_debug_line_not_a_traceback(gone, capsys, caplog):
    server = serve_early("127.0.0.1", 0, "starting")
    try:
        with caplog.at_level(logging.DEBUG, logger="services.metrics.server"):
            try:
                raise gone
            except ConnectionError:
                server._httpd.handle_error(None, ("127.0.0.1", 5))
    finally:
        server.close()
    assert "Traceback" not in capsys.readouterr().err
    records = [r for r in caplog.records if r.name == "services.metrics.server"]
    assert [r.levelno for r in records] == [logging.DEBUG], records
    assert type(gone).__name__ in records[0].getMessage()


def test_a_handler_bug_is_logged_once_as_an_error(capsys, caplog):
    server = serve_early("127.0.0.1", 0, "starting")
    try:
        with caplog.at_level(logging.DEBUG, logger="services.metrics.server"):
            try:
                raise KeyError("a bug")
            except KeyError:
                server._httpd.handle_error(None, ("127.0.0.1", 5))
    finally:
        server.close()
    assert "Traceback" not in capsys.readouterr().err  # not socketserver's own print
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info and errors[0].exc_info[0] is KeyError
