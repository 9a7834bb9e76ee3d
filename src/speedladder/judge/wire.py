"""The wire between the referee and a worker: length-prefixed messages, requests pickled (the worker trusts the
referee), answers as JSON (the referee never unpickles what a candidate's process wrote: a pickle can run code)."""

from __future__ import annotations

import json
import os
import pickle
import select
import struct
import time
from typing import IO, Any

HEADER = struct.Struct("<Q")
MAX_ANSWER = 64 << 20  # an answer is a few kilobytes (a gate record); more is a worker gone wrong


class WireError(RuntimeError):
    """A worker that did not answer, or answered what is not an answer."""


def send_request(f: IO[bytes], request: object) -> None:
    data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(HEADER.pack(len(data)) + data)
    f.flush()


def read_request(f: IO[bytes]) -> Any:
    """The next request, or None when the referee closed the pipe."""
    head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (n,) = HEADER.unpack(head)
    return pickle.loads(f.read(n))


def send_answer(f: IO[bytes], answer: dict[str, Any]) -> None:
    data = json.dumps(answer, allow_nan=False).encode()
    f.write(HEADER.pack(len(data)) + data)
    f.flush()


def _read_exactly(fd: int, n: int, deadline: float, what: str) -> bytes:
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise WireError(f"{what} did not answer in time")
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise WireError(f"{what} exited without answering")
        out += chunk
    return bytes(out)


def read_answer(fd: int, timeout_s: float, what: str) -> dict[str, Any]:
    """The worker's next answer: a JSON object, within timeout_s."""
    deadline = time.monotonic() + timeout_s
    (n,) = HEADER.unpack(_read_exactly(fd, HEADER.size, deadline, what))
    if n > MAX_ANSWER:
        raise WireError(f"{what} sent {n:,} bytes where an answer is a few thousand")
    try:
        answer = json.loads(_read_exactly(fd, n, deadline, what))
    except ValueError:
        raise WireError(f"{what} sent something that is not JSON") from None
    if not isinstance(answer, dict):
        raise WireError(f"{what} sent a {type(answer).__name__} where an answer is an object")
    return answer
