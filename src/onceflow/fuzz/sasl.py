"""The fuzzer against a SASL listener, before and after authentication.

A broker serves one SASL_PLAINTEXT listener with PLAIN. Connections send mutated frames of real
clients' requests (`mutate`), one at a time:

- unauthenticated: only ApiVersions, SaslHandshake and SaslAuthenticate may be answered; an
  answer to any other request is a request served before authentication;
- authenticated first (SaslHandshake v1 and SaslAuthenticate with the right password): the
  broker must answer or close, as on any listener.

A broker that exits or stops answering is a crash; a traceback in its log an internal error.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.faults.broker_process import BrokerProcess
from onceflow.fuzz.duration import runs_on
from onceflow.fuzz.frames import INT32, read_frame, responds
from onceflow.fuzz.mutate import MUTATIONS, Seed, make_seed
from onceflow.protocol.build import build
from onceflow.protocol.codec import decode_response, encode_request, request_type

BEFORE_AUTHENTICATION = frozenset({17, 18, 36})  # SaslHandshake, ApiVersions, SaslAuthenticate
RESPONSE_TIMEOUT_S = 1.0
PROBE_TIMEOUT_S = 15.0
USER, PASSWORD = "fuzzer", "fuzzer-secret"


@dataclass
class SaslFuzzReport:
    seconds: float = 0.0
    sent_unauthenticated: int = 0
    answered_unauthenticated: int = 0  # ApiVersions, SaslHandshake, SaslAuthenticate
    served_before_authentication: list[int] = field(default_factory=list)  # API keys answered
    logins: int = 0
    sent_authenticated: int = 0
    answered_authenticated: int = 0
    crashes: int = 0
    internal_errors: int = 0

    @property
    def clean(self) -> bool:
        return not self.served_before_authentication and self.crashes == 0 and self.internal_errors == 0


def broker_settings() -> dict[str, str]:
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{USER}" password="{PASSWORD}" user_{USER}="{PASSWORD}";'
    )
    return {
        "group.initial.rebalance.delay.ms": "0",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
    }


def run(
    seconds: float, seed: int, connections: int, workdir: Path, recorded: list[bytes], min_sent: int = 0
) -> SaslFuzzReport:
    """Fuzz a new broker's SASL listener for `seconds`, half the connections unauthenticated,
    and on until each half sent `min_sent` frames (a loaded machine sends fewer a second), at
    most ten times as long (`onceflow.fuzz.duration`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    broker = BrokerProcess(
        workdir / "data", broker_settings(), workdir / "broker.log", listener="SASL_PLAINTEXT"
    )
    broker.start()
    report = SaslFuzzReport()
    try:
        seeds = [make_seed(frame) for frame in recorded]
        asyncio.run(_Campaign(broker, seeds, seed, report).run(seconds, connections, min_sent))
        report.internal_errors = broker.log_path.read_text(errors="replace").count("Traceback")
    finally:
        broker.kill()
    return report


class _Campaign:
    def __init__(self, broker: BrokerProcess, seeds: list[Seed], seed: int, report: SaslFuzzReport) -> None:
        self.broker = broker
        self.seeds = seeds
        self.seed = seed
        self.report = report
        self.stopping = False

    async def run(self, seconds: float, connections: int, min_sent: int) -> None:
        started = time.monotonic()
        workers = [asyncio.create_task(self._worker(index, index % 2 == 1)) for index in range(connections)]
        report = self.report

        def going_on() -> bool:
            sent = min(report.sent_authenticated, report.sent_unauthenticated)
            return runs_on(time.monotonic() - started, seconds, sent, min_sent)

        try:
            while going_on():
                await asyncio.sleep(0.5)
                if not await self._alive():
                    self.report.crashes += 1
                    break
        finally:
            self.stopping = True
            await asyncio.gather(*workers, return_exceptions=True)
        self.report.seconds = round(time.monotonic() - started, 1)

    async def _alive(self) -> bool:
        process = self.broker.process
        if process is None or process.poll() is not None:
            return False
        return await responds(self.broker.port, PROBE_TIMEOUT_S) or await responds(
            self.broker.port, PROBE_TIMEOUT_S
        )

    async def _worker(self, index: int, authenticated: bool) -> None:
        rng = random.Random(f"{self.seed}:{index}")
        while not self.stopping:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.broker.port), PROBE_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                await asyncio.sleep(0.1)
                continue
            try:
                if authenticated:
                    await _log_in(reader, writer)
                    self.report.logins += 1
                await self._exchange(rng, reader, writer, authenticated)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                pass  # the broker closed the connection, or did not answer in time: a new one
            finally:
                writer.transport.abort()

    async def _exchange(
        self,
        rng: random.Random,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        authenticated: bool,
    ) -> None:
        report = self.report
        while not self.stopping:
            seed = rng.choice(self.seeds)
            # One frame at a time, so that each answer belongs to the frame just sent.
            frame = rng.choice(MUTATIONS)(rng, seed, self.seeds)[0]
            api_key = struct.unpack_from(">h", frame)[0] if len(frame) >= 2 else -1
            writer.write(INT32.pack(len(frame)) + frame)
            if authenticated:
                report.sent_authenticated += 1
            else:
                report.sent_unauthenticated += 1
            await writer.drain()
            await asyncio.wait_for(read_frame(reader), RESPONSE_TIMEOUT_S)
            if authenticated:
                report.answered_authenticated += 1
            elif api_key in BEFORE_AUTHENTICATION:
                report.answered_unauthenticated += 1
            else:
                report.served_before_authentication.append(api_key)


async def _log_in(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """SaslHandshake v1 and SaslAuthenticate v2 with PLAIN; ValueError when refused."""
    handshake = await _call(reader, writer, 17, 1, {"mechanism": "PLAIN"})
    if handshake.error_code != ErrorCode.none:
        raise ValueError(f"SaslHandshake refused: {handshake.error_code.name}")
    token = f"\0{USER}\0{PASSWORD}".encode()
    answer = await _call(reader, writer, 36, 2, {"auth_bytes": token})
    if answer.error_code != ErrorCode.none:
        raise ValueError(f"SaslAuthenticate refused: {answer.error_message}")


async def _call(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    api_key: int,
    version: int,
    fields: dict[str, Any],
) -> Any:
    body = build(request_type(api_key, version), fields)
    header = build(
        body.__header_schema__,
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=1,
        client_id="onceflow-fuzz",
    )
    writer.write(encode_request(header, body))
    await writer.drain()
    frame = await asyncio.wait_for(read_frame(reader), PROBE_TIMEOUT_S)
    return decode_response(api_key, version, frame)[1]
