"""How the tools' own wire client (`admin.client`) connects when `--command-config` asks for
security, read from the same librdkafka property names confluent-kafka takes:
`security.protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), `ssl.ca.location`,
`ssl.certificate.location`, `ssl.key.location`, `ssl.key.password`,
`ssl.endpoint.identification.algorithm` (https, the default, checks the broker's name; none
does not), and `sasl.mechanism` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) with `sasl.username` and
`sasl.password`."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from onceflow.admin.errors import AdminError
from onceflow.security.scram import HASHES

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", *HASHES)


@dataclass(frozen=True)
class ClientLogin:
    ssl_context: ssl.SSLContext | None = None
    mechanism: str | None = None  # SASL
    username: str = ""
    password: str = ""


PLAINTEXT = ClientLogin()


def client_login(properties: Mapping[str, str] | None) -> ClientLogin:
    """What the properties ask for; AdminError for settings that cannot work."""
    properties = properties or {}
    protocol = properties.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise AdminError(f"security.protocol={protocol}: expected one of {', '.join(PROTOCOLS)}")
    context = _ssl_context(properties) if protocol.endswith("SSL") else None
    if not protocol.startswith("SASL"):
        return ClientLogin(context) if context is not None else PLAINTEXT
    mechanism = properties.get("sasl.mechanism", "GSSAPI").upper()
    if mechanism not in MECHANISMS:
        raise AdminError(f"sasl.mechanism={mechanism}: this tool speaks {', '.join(MECHANISMS)}")
    username, password = properties.get("sasl.username"), properties.get("sasl.password")
    if not username or password is None:
        raise AdminError(f"{mechanism} needs sasl.username and sasl.password")
    return ClientLogin(context, mechanism, username, password)


def _ssl_context(properties: Mapping[str, str]) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=properties.get("ssl.ca.location"))
        certificate = properties.get("ssl.certificate.location")
        if certificate:
            context.load_cert_chain(
                certificate, properties.get("ssl.key.location"), properties.get("ssl.key.password")
            )
    except (OSError, ssl.SSLError) as error:
        raise AdminError(f"cannot set up TLS: {error}") from error
    if properties.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        context.check_hostname = False
    return context
