"""The CLI's TLS: certificates and host names are checked against the CAs httpx trusts (SSL_CERT_FILE here), and
those CAs are loaded at the first TLS connection only, never for a Conch reached over http://."""

from __future__ import annotations

import datetime
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conch_cli.api import ConchApi
from conch_cli.errors import UNAVAILABLE, CliError
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _certificate(subject: str, issuer_key, issuer_name, key, *, ca: bool, host: str | None = None):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    if host:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False
        ).add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture
def https_server(tmp_path):
    """An HTTPS server on 127.0.0.1 (certificate for `localhost`, signed by a CA of its own) answering every GET
    with `{"ok": true}`; yields (port, path of the CA's PEM)."""
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("conch test CA", ca_key, None, ca_key, ca=True)
    server = _certificate("localhost", ca_key, ca.subject, server_key, ca=False, host="localhost")
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "server.pem").write_bytes(
        server.public_bytes(serialization.Encoding.PEM)
        + server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps({"ok": True}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], tmp_path / "ca.pem"
    httpd.shutdown()
    httpd.server_close()


def test_a_conch_over_https_is_trusted_only_with_its_ca_and_under_its_name(https_server, monkeypatch):
    port, ca = https_server
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    # without its CA (certifi's bundle only) the server is refused
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with ConchApi(f"https://localhost:{port}", "t") as api, pytest.raises(CliError) as refused:
        api.get("/api/v1/models/")
    assert refused.value.exit_code == UNAVAILABLE and "CERTIFICATE_VERIFY_FAILED" in refused.value.detail
    # with its CA it is trusted
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    with ConchApi(f"https://localhost:{port}", "t") as api:
        assert api.get("/api/v1/models/") == {"ok": True}
    # and under another name than its certificate's it is refused
    with ConchApi(f"https://127.0.0.1:{port}", "t") as api, pytest.raises(CliError) as wrong_name:
        api.get("/api/v1/models/")
    assert "CERTIFICATE_VERIFY_FAILED" in wrong_name.value.detail


def test_the_trusted_cas_are_loaded_at_the_first_tls_connection_only(cli, conch_env, https_server, monkeypatch):
    port, ca = https_server
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    # a Conch over http:// (the live server) never loads them
    with ConchApi(conch_env.url, conch_env.token) as api:
        assert api.get("/api/v1/teams/")
        assert api.ssl_context.cert_store_stats()["x509_ca"] == 0
        # a TLS connection of the same client (as to a bucket over https) loads them first
        assert api.get(f"https://localhost:{port}/anything") == {"ok": True}
        assert api.ssl_context.cert_store_stats()["x509_ca"] == 1
