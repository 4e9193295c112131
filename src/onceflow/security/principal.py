"""Principals: `User:ANONYMOUS` on PLAINTEXT, `User:<name>` after SASL, and after TLS client
authentication the certificate's subject as Kafka names it (RFC 2253, the most specific name
first), mapped by `ssl.principal.mapping.rules` (`DEFAULT`, or `RULE:pattern/replacement/[LU]`,
the first rule whose pattern matches the whole name wins)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

ANONYMOUS = "User:ANONYMOUS"

_SHORT_NAMES = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
    "emailAddress": "EMAILADDRESS",
}
_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?))\s*(?:,|$)")


class MappingRuleError(ValueError):
    pass


def subject_name(peer_certificate: dict[str, Any]) -> str:
    """The subject of a certificate as `ssl.SSLObject.getpeercert()` gives it, in RFC 2253 form."""
    rdns = []
    for rdn in reversed(peer_certificate.get("subject", ())):
        rdns.append("+".join(f"{_SHORT_NAMES.get(key, key)}={_escape(value)}" for key, value in rdn))
    return ",".join(rdns)


def _escape(value: str) -> str:
    escaped = re.sub(r'([,+"\\<>;])', r"\\\1", value)
    if escaped.startswith(("#", " ")):
        escaped = "\\" + escaped
    if escaped.endswith(" ") and not escaped.endswith("\\ "):
        escaped = escaped[:-1] + "\\ "
    return escaped


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT, the name as it is
    replacement: str = ""
    case: str = ""

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        if self.pattern.fullmatch(name) is None:
            return None
        mapped = self.pattern.sub(self.replacement, name)
        return mapped.lower() if self.case == "L" else mapped.upper() if self.case == "U" else mapped


class PrincipalMapper:
    def __init__(self, rules: str = "DEFAULT") -> None:
        self._rules: list[_Rule] = []
        position = 0
        text = rules.strip() or "DEFAULT"
        while position < len(text):
            match = _RULE.match(text, position)
            if match is None or match.end() == position:
                raise MappingRuleError(f"Invalid rule: {text[position:]}")
            if match.group(1):
                self._rules.append(_Rule(None))
            else:
                try:
                    pattern = re.compile(match.group(2))
                except re.error as error:
                    raise MappingRuleError(f"Invalid rule pattern {match.group(2)!r}: {error}") from None
                # Java's $1 is Python's \1.
                replacement = re.sub(r"\$(\d+)", r"\\\1", match.group(3))
                self._rules.append(_Rule(pattern, replacement, match.group(4)))
            position = match.end()

    def principal(self, distinguished_name: str) -> str:
        for rule in self._rules:
            mapped = rule.apply(distinguished_name)
            if mapped is not None:
                return f"User:{mapped}"
        raise MappingRuleError(f"No rules apply to {distinguished_name}")
