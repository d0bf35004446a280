"""Certificates for the local broker's TLS listener: a CA made for one data directory, and the
broker's key and certificate it signs, made with the JDK's keytool (no extra Python package)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from undertow.infra.broker import kafka_dist

# A PKCS12 keystore must have a password; what guards the broker's key is the 0700 data directory.
KEYSTORE_PASSWORD = "undertow-local"


def make_certificates(tls: Path) -> None:
    """A CA, and a broker key + certificate it signs for 127.0.0.1 / localhost, made with the JDK's keytool.

    Writes `ca.pem` (what clients trust) and `broker.p12` (the broker's key, its certificate and the
    CA's). The CA's own key is deleted once it has signed: nothing else can be made to look trusted.
    """
    tmp = tls.with_name(tls.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700, parents=True)
    ca = ["-keystore", "ca.p12", "-alias", "ca"]
    broker = ["-keystore", "broker.p12", "-alias", "broker"]
    new_key = ["-keyalg", "EC", "-groupname", "secp256r1", "-validity", "3650"]
    # Key usage, key identifiers and a critical basicConstraints: what strict X.509 checks (Python 3.13+) want.
    _keytool(tmp, "-genkeypair", *ca, *new_key, "-dname", "CN=undertow local CA", "-ext", "bc:c",
             "-ext", "ku:c=keyCertSign,cRLSign")
    _keytool(tmp, "-exportcert", *ca, "-rfc", "-file", "ca.pem")
    _keytool(tmp, "-genkeypair", *broker, *new_key, "-dname", "CN=localhost")
    _keytool(tmp, "-certreq", *broker, "-file", "broker.csr")
    _keytool(tmp, "-gencert", *ca, "-validity", "3650", "-infile", "broker.csr", "-outfile", "broker.pem", "-rfc",
             "-ext", "SAN=ip:127.0.0.1,dns:localhost", "-ext", "ku:c=digitalSignature",
             "-ext", "eku=serverAuth,clientAuth")
    _keytool(tmp, "-importcert", "-keystore", "broker.p12", "-alias", "ca", "-file", "ca.pem")
    _keytool(tmp, "-importcert", *broker, "-file", "broker.pem")  # the signed chain replaces the self-signed one
    for leftover in ("ca.p12", "broker.csr", "broker.pem"):
        (tmp / leftover).unlink()
    shutil.rmtree(tls, ignore_errors=True)
    tmp.rename(tls)  # all or nothing: a half-made directory is never taken for a finished one


def _keytool(cwd: Path, *args: str) -> None:
    keytool = Path(kafka_dist.java()).resolve().parent / "keytool"
    cmd = [str(keytool), *args, "-storetype", "PKCS12", "-storepass", KEYSTORE_PASSWORD, "-noprompt"]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"keytool {args[0]} failed in {cwd}:\n{proc.stdout}{proc.stderr}")


# Client certificates (mutual TLS, one principal per component): made with the openssl command, since
# Python's ssl module loads keys only from PEM files and keytool cannot write one.
CLIENTS_CA = "clients-ca"
CLIENTS_DIR = "clients"
CLIENT_DAYS = 30


def make_clients_ca(tls: Path) -> None:
    """A fresh CA that signs client certificates only (the brokers' own CA key is gone), replacing any
    earlier one and every certificate it signed: a certificate issued before this call no longer logs in."""
    shutil.rmtree(tls / CLIENTS_DIR, ignore_errors=True)
    (tls / CLIENTS_DIR).mkdir(mode=0o700)
    _openssl(tls, "req", "-x509", *_EC, "-nodes", "-keyout", f"{CLIENTS_CA}.key", "-out", f"{CLIENTS_CA}.pem",
             "-subj", "/CN=undertow local clients CA", "-days", "3650",
             "-addext", "basicConstraints=critical,CA:true", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    (tls / f"{CLIENTS_CA}.key").chmod(0o600)


def issue_client_certificate(tls: Path, name: str) -> tuple[Path, Path]:
    """A key and a certificate for the principal `User:<name>` (the certificate's CN), signed by the
    clients CA and valid CLIENT_DAYS days. Returns (certificate, key), PEM files readable by the owner only."""
    cert, key = tls / CLIENTS_DIR / f"{name}.pem", tls / CLIENTS_DIR / f"{name}.key"
    _openssl(tls, "req", "-x509", *_EC, "-nodes", "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
             "-days", str(CLIENT_DAYS), "-CA", f"{CLIENTS_CA}.pem", "-CAkey", f"{CLIENTS_CA}.key",
             "-addext", "keyUsage=critical,digitalSignature", "-addext", "extendedKeyUsage=clientAuth")
    key.chmod(0o600)
    return cert, key


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


def _openssl(cwd: Path, *args: str) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed in {cwd}:\n{proc.stdout}{proc.stderr}")
