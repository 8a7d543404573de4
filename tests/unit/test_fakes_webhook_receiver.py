"""The webhook receiver fake behaves as the CDC tests rely on it to."""

from __future__ import annotations

import random
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from fakes import (
    WebhookReceiver,
    client_ssl_context,
    make_certs,
    reserve_port,
    sign_standard_webhook,
    verify_standard_webhook,
)


def test_records_every_batch_in_order_on_one_keep_alive_connection() -> None:
    with WebhookReceiver() as receiver, httpx.Client() as client:
        assert receiver.url == f"http://127.0.0.1:{receiver.port}/hook"
        for i in range(3):
            response = client.post(receiver.url, json={"n": i}, headers={"X-Test": "yes"})
            assert response.status_code == 200

        assert receiver.batches == [{"n": 0}, {"n": 1}, {"n": 2}]
        requests = receiver.requests
        assert [r.seq for r in requests] == [0, 1, 2]
        first = requests[0]
        assert (first.method, first.path, first.status) == ("POST", "/hook", 200)
        assert first.accepted and not first.dropped and not first.tls
        assert first.body == b'{"n":0}'
        assert first.header("x-test") == "yes"
        assert first.header("Content-Type") == "application/json"
        assert len({r.connection_id for r in requests}) == 1  # keep-alive reuse
        assert requests[0].received_monotonic <= requests[2].received_monotonic
        assert abs(requests[0].received_wall - time.time()) < 60


@pytest.mark.parametrize("status", [200, 202, 204])
def test_configured_success_status(status: int) -> None:
    with WebhookReceiver(status_code=status) as receiver:
        response = httpx.post(receiver.url, json={"ok": 1})
        assert response.status_code == status
        assert receiver.batches == [{"ok": 1}]


def test_non_json_and_non_post_are_refused() -> None:
    with WebhookReceiver() as receiver:
        assert httpx.post(receiver.url, content=b"not json").status_code == 400
        assert httpx.get(receiver.url).status_code == 405
        assert receiver.batches == []
        assert [r.status for r in receiver.rejected] == [400, 405]


def test_chunked_body_is_read() -> None:
    with WebhookReceiver() as receiver:
        response = httpx.post(receiver.url, content=iter([b'{"a":', b" 1}"]))
        assert response.status_code == 200
        assert receiver.batches == [{"a": 1}]
        assert receiver.requests[0].header("transfer-encoding") == "chunked"


def test_fail_share_fails_that_share_deterministically_with_a_seed() -> None:
    share, seed, n = 0.3, 1234, 200
    draws = random.Random(seed)
    expected_failures = sum(draws.random() < share for _ in range(n))
    patterns = []
    for _ in range(2):
        with WebhookReceiver(fail_share=share, seed=seed) as receiver, httpx.Client() as client:
            codes = [client.post(receiver.url, json={"i": i}).status_code for i in range(n)]
        assert set(codes) == {200, 503}
        assert codes.count(503) == expected_failures
        assert abs(codes.count(503) / n - share) < 0.1
        assert len(receiver.batches) == codes.count(200)
        patterns.append(codes)
    assert patterns[0] == patterns[1]  # same seed, same requests: same answers


def test_fail_share_can_change_while_running() -> None:
    with WebhookReceiver() as receiver, httpx.Client() as client:
        receiver.fail_share = 1.0
        assert client.post(receiver.url, json={}).status_code == 503
        receiver.fail_share = 0.0
        assert client.post(receiver.url, json={}).status_code == 200
        with pytest.raises(ValueError, match="fail_share"):
            receiver.fail_share = 1.5


def test_fail_next() -> None:
    with WebhookReceiver() as receiver, httpx.Client() as client:
        receiver.fail_next(2)
        receiver.fail_next(1, status=500)
        codes = [client.post(receiver.url, json={"i": i}).status_code for i in range(5)]
        assert codes == [503, 503, 500, 200, 200]
        assert receiver.batches == [{"i": 3}, {"i": 4}]


def test_delay_outlasts_a_client_timeout() -> None:
    with WebhookReceiver(delay_seconds=0.6) as receiver:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(receiver.url, json={"slow": True}, timeout=0.15)
        # The receiver still answers (late) and records that it slept.
        requests = receiver.wait_for_requests(lambda rs: len(rs) == 1, timeout=5)
        assert requests[0].delay_seconds == pytest.approx(0.6)
        receiver.delay_seconds = 0.0
        assert httpx.post(receiver.url, json={}, timeout=5.0).status_code == 200
        assert receiver.requests[1].delay_seconds == 0.0


def test_dropped_connection_gives_a_client_error() -> None:
    with WebhookReceiver(drop_connections=True) as receiver:
        with pytest.raises(httpx.TransportError):
            httpx.post(receiver.url, json={"lost": True})
        request = receiver.wait_for_requests(lambda rs: len(rs) == 1)[0]
        assert request.dropped and request.status is None and not request.accepted
        assert receiver.batches == []

        receiver.drop_connections = False
        receiver.drop_next(1)
        with httpx.Client() as client:
            with pytest.raises(httpx.TransportError):
                client.post(receiver.url, json={"lost": 2})
            assert client.post(receiver.url, json={"kept": 3}).status_code == 200
        assert receiver.batches == [{"kept": 3}]


def test_https_verifies_with_the_generated_ca(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    assert [p.name for p in (certs.ca_cert, certs.server_cert, certs.server_key)] == [
        "ca.pem",
        "server.pem",
        "server.key",
    ]
    assert {certs.client_cert.name, certs.client_key.name} == {"client.pem", "client.key"}
    other_ca = make_certs(tmp_path / "other")

    with WebhookReceiver(tls=certs) as receiver:
        assert receiver.url.startswith("https://127.0.0.1:")
        verify = client_ssl_context(certs, client_cert=False)
        assert httpx.post(receiver.url, json={"s": 1}, verify=verify).status_code == 200
        # "localhost" is in the certificate too.
        local = f"https://localhost:{receiver.port}/hook"
        assert httpx.post(local, json={"s": 2}, verify=verify).status_code == 200

        wrong_ca = client_ssl_context(other_ca, client_cert=False)
        with pytest.raises(httpx.ConnectError):
            httpx.post(receiver.url, json={}, verify=wrong_ca)
        with pytest.raises(httpx.ConnectError):
            httpx.post(receiver.url, json={})  # system trust store: unknown CA

        assert receiver.batches == [{"s": 1}, {"s": 2}]
        assert all(r.tls and r.client_cert_subject is None for r in receiver.requests)


def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    with WebhookReceiver(tls=certs, require_client_cert=True) as receiver:
        no_cert = client_ssl_context(certs, client_cert=False)
        with pytest.raises(httpx.TransportError):
            httpx.post(receiver.url, json={"no": "cert"}, verify=no_cert)
        deadline = time.monotonic() + 5
        while not receiver.tls_failures and time.monotonic() < deadline:
            time.sleep(0.01)
        assert receiver.tls_failures, "the handshake failure is recorded"

        with_cert = client_ssl_context(certs)
        assert httpx.post(receiver.url, json={"with": "cert"}, verify=with_cert).status_code == 200
        assert receiver.batches == [{"with": "cert"}]
        subject = receiver.requests[0].client_cert_subject
        assert subject is not None and f"commonName={certs.client_common_name}" in subject


def test_mutual_tls_refuses_a_certificate_from_another_ca(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "a")
    stranger = make_certs(tmp_path / "b")
    with WebhookReceiver(tls=certs, require_client_cert=True) as receiver:
        ctx = client_ssl_context(certs, client_cert=False)
        ctx.load_cert_chain(stranger.client_cert, stranger.client_key)
        with pytest.raises(httpx.TransportError):
            httpx.post(receiver.url, json={}, verify=ctx)
        assert receiver.batches == []


def test_standard_webhooks_signature_matches_the_reference_vector() -> None:
    # The test vector of the Standard Webhooks reference libraries.
    signature = sign_standard_webhook(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        b'{"test": 2432232314}',
    )
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    headers = {
        "Webhook-Id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "Webhook-Timestamp": "1614265330",
        "Webhook-Signature": signature,
    }
    body = b'{"test": 2432232314}'
    assert verify_standard_webhook(
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", headers, body, tolerance_seconds=None
    )
    assert not verify_standard_webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", headers, body)


def test_verify_standard_webhooks_per_request() -> None:
    secret = "whsec_" + "c2VjcmV0LWZvci10aGUtd2ViaG9vay10ZXN0cw=="
    wrong = "whsec_" + "YW5vdGhlci1zZWNyZXQtZW50aXJlbHk="
    body = b'{"payload":[{"index":1}]}'
    now = int(time.time())

    def headers(sig: str, ts: int = now, msg_id: str = "msg_1") -> dict[str, str]:
        return {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(ts),
            "webhook-signature": sig,
        }

    cases = [
        (headers(sign_standard_webhook(secret, "msg_1", now, body)), body),  # valid
        (headers(sign_standard_webhook(wrong, "msg_1", now, body)), body),  # wrong secret
        (headers(sign_standard_webhook(secret, "msg_1", now, body)), body + b" "),  # tampered
        (headers(sign_standard_webhook(secret, "msg_1", now - 3600, body), now - 3600), body),
        ({"content-type": "application/json"}, body),  # unsigned
        (
            headers("v1a,AAAA v1,bm90LWl0 " + sign_standard_webhook(secret, "msg_1", now, body)),
            body,
        ),  # rotation: one of several signatures matches
    ]
    with WebhookReceiver() as receiver, httpx.Client() as client:
        for hdrs, content in cases:
            assert client.post(receiver.url, content=content, headers=hdrs).status_code == 200
        assert receiver.verify_standard_webhooks(secret) == [True, False, False, False, False, True]
        stale_ok = receiver.verify_standard_webhooks(secret, tolerance_seconds=None)
        assert stale_ok == [True, False, False, True, False, True]


def test_late_start_on_a_port_chosen_in_advance() -> None:
    port = reserve_port()
    receiver = WebhookReceiver(port=port)
    assert receiver.url == f"http://127.0.0.1:{port}/hook"
    assert not receiver.running
    with pytest.raises(httpx.ConnectError):
        httpx.post(receiver.url, json={"early": True}, timeout=1.0)

    with httpx.Client() as client:
        receiver.start()
        try:
            assert client.post(receiver.url, json={"n": 1}).status_code == 200
        finally:
            receiver.stop()
        with pytest.raises(httpx.ConnectError):
            client.post(receiver.url, json={"down": True}, timeout=1.0)

        # Started again on the same port: the client's old keep-alive connection was
        # closed by stop(), so the request arrives on a new connection.
        with receiver:
            assert receiver.port == port
            assert client.post(receiver.url, json={"n": 2}).status_code == 200
    assert receiver.batches == [{"n": 1}, {"n": 2}]
    assert len({r.connection_id for r in receiver.requests}) == 2


def test_stop_releases_the_port() -> None:
    with WebhookReceiver() as receiver, httpx.Client() as client:
        port = receiver.port
        assert client.post(receiver.url, json={}).status_code == 200  # leaves a keep-alive
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_wait_for_sees_batches_that_arrive_later() -> None:
    with WebhookReceiver() as receiver:

        def send_later() -> None:
            time.sleep(0.2)
            for i in range(3):
                httpx.post(receiver.url, json={"i": i})

        sender = threading.Thread(target=send_later)
        sender.start()
        batches = receiver.wait_for(lambda bs: len(bs) == 3, timeout=5)
        sender.join()
        assert sorted(b["i"] for b in batches) == [0, 1, 2]
        with pytest.raises(TimeoutError, match="3 accepted batches"):
            receiver.wait_for(lambda bs: len(bs) > 3, timeout=0.2)


def test_port_is_unknown_until_started_unless_given() -> None:
    receiver = WebhookReceiver()
    with pytest.raises(RuntimeError, match="reserve_port"):
        _ = receiver.url
    with pytest.raises(ValueError, match="require_client_cert"):
        WebhookReceiver(require_client_cert=True)
