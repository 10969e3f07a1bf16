"""``statequery serve --host ::1``: the server's URLs put an IPv6 address in brackets, and its
free ports are found on that address (an IPv4 socket cannot bind ``::1``)."""

from __future__ import annotations

import socket

import pytest

from statequery.spark.server import check_loopback, connect_url, free_port, jdbc_url


def test_ipv6_loopback_urls_have_brackets() -> None:
    assert jdbc_url("::1", 10001) == "jdbc:hive2://[::1]:10001/default"
    assert connect_url("::1", 15002) == "sc://[::1]:15002"
    assert jdbc_url("127.0.0.1", 10001) == "jdbc:hive2://127.0.0.1:10001/default"
    assert connect_url("127.0.0.1", 15002) == "sc://127.0.0.1:15002"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_free_port_is_free_on_that_address(host: str) -> None:
    assert check_loopback(host) == host
    port = free_port(host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, port))  # free: it binds
        s.listen()
        with socket.create_connection((host, port), timeout=2):
            pass
