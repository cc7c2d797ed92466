"""Who a request is from (serve/security.client_key): the fair queue's client and the prefix cache's scope."""

from __future__ import annotations

import pytest

from localrt.serve.security import client_key


@pytest.mark.parametrize(
    "peer, forwarded, want",
    [
        ("10.0.0.5", None, "10.0.0.5"),
        ("10.0.0.5", "10.0.0.9", "10.0.0.5"),  # a remote caller cannot claim another address
        ("127.0.0.1", "10.0.0.5", "forwarded:10.0.0.5"),  # a proxy here: its client, named apart from a direct one
        ("::1", "2001:db8::7, 10.0.0.1", "forwarded:2001:db8::/64"),
        ("127.0.0.1", None, "127.0.0.1"),
        ("::ffff:10.0.0.5", None, "10.0.0.5"),
        ("2001:db8::1234", None, "2001:db8::/64"),
    ],
)
def test_client_key(peer, forwarded, want):
    headers = {"x-forwarded-for": forwarded} if forwarded else {}
    assert client_key({"client": (peer, 40000)}, headers) == want


def test_what_this_machine_claims_never_joins_a_direct_clients_scope():
    direct = client_key({"client": ("10.0.0.5", 1)}, {})
    claimed = client_key({"client": ("127.0.0.1", 1)}, {"x-forwarded-for": "10.0.0.5"})
    assert direct != claimed
