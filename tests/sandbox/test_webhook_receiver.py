"""The sandbox's webhook receiver: what it is POSTed is what GET /messages lists, in order."""

from __future__ import annotations

import threading

import httpx
import pytest

from infra.sandbox.ports import free_port
from infra.sandbox.webhook_receiver import make_server


@pytest.fixture
def receiver_url():
    server = make_server("127.0.0.1", free_port())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_it_lists_every_json_body_in_arrival_order(receiver_url):
    assert httpx.get(f"{receiver_url}/messages").json() == []
    for n in (1, 2):
        assert httpx.post(f"{receiver_url}/notify", json={"text": f"notice {n}"}).status_code == 200
    assert httpx.get(f"{receiver_url}/messages").json() == [{"text": "notice 1"}, {"text": "notice 2"}]


def test_a_body_that_is_not_json_is_refused_and_not_kept(receiver_url):
    answer = httpx.post(f"{receiver_url}/notify", content=b"not json")
    assert answer.status_code == 400 and "not JSON" in answer.text
    assert httpx.get(f"{receiver_url}/messages").json() == []
