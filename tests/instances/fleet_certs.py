"""Throwaway private CAs and certificates for TLS between instances, made with the
``openssl`` command (as ``tests/http/test_http2.py`` does).

    files = make_ca(tmp, "fleet")                       # fleet.pem, fleet-key.pem
    cert, key = sign(tmp, files, "a", usage="serverAuth,clientAuth")
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="needs the openssl command")
CURVE = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _run(*argv: str) -> None:
    subprocess.run([OPENSSL or "openssl", *argv], check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA: (its certificate, its key)."""
    cert, key = folder / f"{name}.pem", folder / f"{name}-key.pem"
    _run("req", "-x509", *CURVE, "-keyout", str(key), "-out", str(cert),
         "-subj", f"/CN=acp-server test {name} CA", "-days", "2")
    return cert, key


def sign(folder: Path, ca: tuple[Path, Path], name: str, *,
         usage: str | None = "serverAuth,clientAuth") -> tuple[Path, Path]:
    """A certificate ``ca`` signed for localhost and 127.0.0.1 (X.509 v3), with the
    extended key usage ``usage`` (``None``: no such extension): (certificate, key)."""
    cert, key, csr = (folder / f"{name}.pem", folder / f"{name}-key.pem",
                      folder / f"{name}.csr")
    ext = folder / f"{name}.cnf"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                   + (f"extendedKeyUsage={usage}\n" if usage else ""))
    _run("req", *CURVE, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
         "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return cert, key
