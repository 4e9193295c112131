"""Kafka's `sasl.jaas.config` values: `<LoginModule class> required key="value" ...;`."""

from __future__ import annotations

import re
from dataclasses import dataclass

_OPTION = re.compile(r'\s*([A-Za-z0-9_.\-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))')

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


class JaasError(ValueError):
    pass


@dataclass(frozen=True)
class JaasConfig:
    module: str
    options: dict[str, str]

    @property
    def plain_users(self) -> dict[str, str]:
        """PlainLoginModule's `user_NAME="password"` options: the users PLAIN accepts."""
        return {key[len("user_") :]: value for key, value in self.options.items() if key.startswith("user_")}

    @property
    def login(self) -> tuple[str, str] | None:
        """The `username` and `password` this broker logs in with to other brokers."""
        username, password = self.options.get("username"), self.options.get("password")
        return None if username is None or password is None else (username, password)


def parse_jaas(text: str) -> JaasConfig:
    text = text.strip()
    if not text.endswith(";"):
        raise JaasError("a JAAS config ends with ';'")
    module, _, rest = text[:-1].strip().partition(" ")
    flag, _, rest = rest.strip().partition(" ")
    if not module or flag not in ("required", "requisite", "sufficient", "optional"):
        raise JaasError("expected '<LoginModule class> required key=\"value\" ...;'")
    options: dict[str, str] = {}
    position = 0
    rest = rest.strip()
    while position < len(rest):
        match = _OPTION.match(rest, position)
        if match is None:
            raise JaasError(f"cannot read an option at {rest[position : position + 20]!r}")
        quoted, bare = match.group(2), match.group(3)
        options[match.group(1)] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        position = match.end()
        while position < len(rest) and rest[position].isspace():
            position += 1
    return JaasConfig(module, options)
