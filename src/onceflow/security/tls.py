"""TLS contexts from Kafka's `ssl.*` settings, with PEM key and trust stores
(`ssl.keystore.type=PEM`, `ssl.truststore.type=PEM`): a file (`*.location`) or the PEM text
itself (`ssl.keystore.certificate.chain` with `ssl.keystore.key`, `ssl.truststore.certificates`)."""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable

Setting = Callable[[str], str]  # a listener's value of an ssl.* key ("" when unset)

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


class TlsConfigError(ValueError):
    pass


def server_context(setting: Setting) -> ssl.SSLContext:
    """A listener's context: its key and certificate, and whether clients must show one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _common(context, setting)
    if not _load_keystore(context, setting):
        raise TlsConfigError("a TLS listener needs ssl.keystore.location (or ssl.keystore.key)")
    context.verify_mode = CLIENT_AUTH[setting("ssl.client.auth") or "none"]
    if context.verify_mode != ssl.CERT_NONE and not _load_truststore(context, setting):
        raise TlsConfigError(f"ssl.client.auth={setting('ssl.client.auth')} needs ssl.truststore.location")
    return context


def client_context(setting: Setting) -> ssl.SSLContext:
    """A client's context (a broker to another): the trust store, a key if one is set, and
    the host name checked when ssl.endpoint.identification.algorithm is https."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _common(context, setting)
    if not _load_truststore(context, setting):
        context.load_default_certs()
    _load_keystore(context, setting)
    context.check_hostname = setting("ssl.endpoint.identification.algorithm").lower() == "https"
    return context


def _common(context: ssl.SSLContext, setting: Setting) -> None:
    for key in ("ssl.keystore.type", "ssl.truststore.type"):
        if (setting(key) or "PEM").upper() != "PEM":
            raise TlsConfigError(f"{key}={setting(key)}: only PEM stores are supported (set {key}=PEM)")
    versions = [item.strip() for item in setting("ssl.enabled.protocols").split(",") if item.strip()]
    unknown = [version for version in versions if version not in _VERSIONS]
    if unknown or not versions:
        raise TlsConfigError(f"ssl.enabled.protocols: {', '.join(unknown) or 'none'} (TLSv1.2, TLSv1.3)")
    context.minimum_version = min(_VERSIONS[version] for version in versions)
    context.maximum_version = max(_VERSIONS[version] for version in versions)
    ciphers = setting("ssl.cipher.suites")
    if ciphers:
        try:
            context.set_ciphers(":".join(item.strip() for item in ciphers.split(",")))
        except ssl.SSLError as error:
            raise TlsConfigError(f"ssl.cipher.suites: {error}") from None


def _load_keystore(context: ssl.SSLContext, setting: Setting) -> bool:
    password = setting("ssl.key.password") or setting("ssl.keystore.password") or None
    location = setting("ssl.keystore.location")
    try:
        if location:
            context.load_cert_chain(location, password=password)
            return True
        chain, key = setting("ssl.keystore.certificate.chain"), setting("ssl.keystore.key")
        if chain and key:
            # The ssl module loads keys from files only: a private file, gone at once.
            with tempfile.NamedTemporaryFile("w", suffix=".pem") as file:
                os.chmod(file.name, 0o600)
                file.write(f"{key.strip()}\n{chain.strip()}\n")
                file.flush()
                context.load_cert_chain(file.name, password=password)
            return True
    except (OSError, ssl.SSLError) as error:
        raise TlsConfigError(f"cannot load the key store {location or '(inline)'}: {error}") from None
    return False


def _load_truststore(context: ssl.SSLContext, setting: Setting) -> bool:
    location, inline = setting("ssl.truststore.location"), setting("ssl.truststore.certificates")
    try:
        if location:
            context.load_verify_locations(cafile=location)
            return True
        if inline:
            context.load_verify_locations(cadata=inline)
            return True
    except (OSError, ssl.SSLError) as error:
        raise TlsConfigError(f"cannot load the trust store {location or '(inline)'}: {error}") from None
    return False
