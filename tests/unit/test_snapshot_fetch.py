"""A snapshot download a peer refuses (401) says which of this node's options to fix,
against a real HTTP server answering as a node with an auth file does."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
from fakes.http_server import serving

from litecdc import Store
from litecdc.cluster.node import Member
from litecdc.cluster.snapshot import SnapshotError, SnapshotInstaller, SnapshotSettings


class _Refusing(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"user lc does not have the 'backup' permission"  # (a node's 401, in text)
        self.send_response(401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_peer() -> Iterator[str]:
    with serving(_Refusing) as url:
        yield url


@pytest.mark.parametrize(
    ("user", "asks_with"), [("lc", "--node-user lc"), (None, "no --node-user")]
)
def test_a_refused_snapshot_download_names_the_node_user_options(
    store: Store, refusing_peer: str, user: str | None, asks_with: str
) -> None:
    """Authz QA: a follower whose --node-user lacked 'backup' (or had a wrong password)
    logged `GET …/db/backup answered 401: …` every 2 s, and /readyz said only `[-]store
    not ok`: nothing named the options to fix."""
    installer = SnapshotInstaller(
        store, lambda: [], "n1", SnapshotSettings(user=user, password="pw" if user else None)
    )
    peer = Member(node_id="n0", address=refusing_peer, mode="leader", applied_cid=9,
                  applied_revision=9)  # fmt: skip
    with pytest.raises(SnapshotError) as refused:
        installer._fetch(peer)
    assert str(refused.value) == (
        f"GET {refusing_peer}/db/backup answered 401: user lc does not have the 'backup' "
        f"permission (this node asks with {asks_with}: give it --node-user and "
        "--node-password of a user with the 'backup' permission there)"
    )
