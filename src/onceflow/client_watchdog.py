"""A client that cannot go on ends the process, so that its supervisor starts it again: a call
stuck past its own timeout, or a consumer whose poll returned a fatal error.

librdkafka 2.x (confluent-kafka 2.16) can wait forever in send_offsets_to_transaction, past the
timeout it was given, when the group coordinator's broker dies and drops out of the cluster's
metadata (librdkafka issues 5456 and 5511): the request waits for a state change of a broker
whose thread is gone. A worker in that call well past its timeout is stuck, not slow, and a
new process (whose init_transactions fences the old session) is the only way on.

librdkafka hands a consumer's fatal error (a static member fenced by a successor with its
group.instance.id, KIP-345: after a session that ran out while the group's coordinator moved,
say) to poll as a message with the code _FATAL, on which confluent-kafka's KafkaError.fatal()
is False (only error_cb's errors carry the flag). The consumer fetches nothing after it: a
worker that skips the message as a passing error idles for ever."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, Message

MARGIN_S = 10.0  # past the call's own timeout: a slow answer on a loaded machine is no hang
STUCK_EXIT_CODE = 75  # EX_TEMPFAIL: start me again


@contextmanager
def exit_if_stuck(timeout_s: float, what: str) -> Iterator[None]:
    """Around a call given `timeout_s`: if it has not returned `MARGIN_S` later, one line on
    stderr and the process exits at once (no cleanup can run in a stuck client)."""
    timer = threading.Timer(timeout_s + MARGIN_S, _exit, (timeout_s, what))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _exit(timeout_s: float, what: str) -> None:
    sys.stderr.write(f"{what} has not returned {timeout_s + MARGIN_S:g} s after it began: exiting\n")
    sys.stderr.flush()
    os._exit(STUCK_EXIT_CODE)


def records_or_exit(messages: list[Message]) -> list[Message]:
    """The records among what a consumer's poll returned. A fatal error ends the process with
    one line on stderr; other errors pass (librdkafka retries them)."""
    for message in messages:
        error = message.error()
        if error is not None and is_fatal(error):
            raise SystemExit(f"fatal consumer error: {error.str()}")
    return [message for message in messages if message.error() is None]


def is_fatal(error: KafkaError) -> bool:
    """Whether the client that returned `error` can do no more: flagged fatal, or a consumer's
    fatal error as poll returns it."""
    return bool(error.fatal()) or error.code() == KafkaError._FATAL
