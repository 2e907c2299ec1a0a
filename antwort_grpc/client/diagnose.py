"""Why a connection to the gateway failed, in words a person can act on.

grpcio reports a plaintext client at a TLS port, and a TLS client without the client certificate
mutual TLS requires, both as "Socket closed". Before blaming the address, the client asks the port
itself: a TLS handshake of its own (no verification: it only learns what the port speaks) tells
a TLS port from a plaintext one, and one that demands a client certificate from one that does not.
"""

from __future__ import annotations

import socket
import ssl
from typing import Literal

Spoken = Literal["plaintext", "tls", "tls_client_certificate"]

# HTTP/2's client preface and an empty SETTINGS frame: what a gRPC client sends first.
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# What a TLS server says when the client sent no certificate (TLS 1.3, or TLS 1.2's handshake failure).
_NO_CLIENT_CERTIFICATE = ("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "PEER_DID_NOT_RETURN_A_CERTIFICATE")


def host_port(target: str) -> tuple[str, int] | None:
    """host and port of a target (`host:port`, `[::1]:port`, `dns:///host:port`, `ipv4:…`)."""
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        target = target.removeprefix(scheme)
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def what_the_port_speaks(target: str, timeout: float = 3.0) -> Spoken | None:
    """What the gateway's port answers a TLS client with; None when it cannot be asked."""
    address = host_port(target)
    if address is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        raw = socket.create_connection(address, timeout=timeout)
    except OSError:
        return None
    with raw:
        try:
            with context.wrap_socket(raw, server_hostname=address[0]) as tls:
                # TLS 1.3 servers check the client's certificate after the handshake: the verdict
                # comes with the first read.
                tls.sendall(_H2_HELLO)
                return "tls" if tls.recv(1) else "tls_client_certificate"
        except ssl.SSLError as error:
            if any(mark in str(error) for mark in _NO_CLIENT_CERTIFICATE):
                return "tls_client_certificate"
            return "plaintext"
        except (ConnectionError, TimeoutError):
            return "plaintext"


def connection_problem(
    details: str, target: str, *, plaintext: bool, cacert: str | None, cert: str | None
) -> str | None:
    """What is wrong with how the client connects, from grpcio's details and, when they do not say,
    from the port itself; None when the gateway is simply not there."""
    if "Connection refused" in details or "DNS resolution failed" in details or "Name or service" in details:
        return None
    if "WRONG_VERSION_NUMBER" in details:
        return "it does not speak TLS: use --plaintext"
    if "CERTIFICATE_VERIFY_FAILED" in details:
        where = f"--cacert {cacert}" if cacert else "the system's CAs"
        return f"its TLS certificate is not signed by {where}: pass the CA that signed it with --cacert"
    if "not in peer certificate" in details or "Peer name" in details:
        return "its TLS certificate does not name that host: connect by a name it has, or set --authority"
    spoken = what_the_port_speaks(target)
    if plaintext and spoken in ("tls", "tls_client_certificate"):
        line = "it speaks TLS and this client does not: use --tls, with --cacert FILE unless the system trusts its CA"
        if spoken == "tls_client_certificate":
            line += ", and --cert/--key (it requires a client certificate)"
        return line
    if not plaintext and spoken == "tls_client_certificate":
        if cert is None:
            return "it requires a client certificate (mutual TLS): pass --cert and --key"
        return f"it refused the client certificate --cert {cert}: is it signed by the CA it trusts for clients?"
    if not plaintext and spoken == "plaintext":
        return "it does not speak TLS: use --plaintext"
    return None
