"""A strict multipart/form-data reader for the audio routes: the text fields, and which file
parts there are, without copying or decoding any file.

Why not python-multipart (Starlette's parser)? It is a streaming, callback parser built to
spool uploads to disk; here the body is already in memory (read within the body limit), and
routing needs only a few short fields. Finding the delimiters with bytes.find runs in C over
the audio and copies nothing of it; the grammar accepted is what every HTTP client sends
(RFC 7578: no preamble, CRLF line ends), so anything else is refused with a clear 400 here
rather than routed and refused by a replica.

The boundary is read from the body's first line: ParsedRequest has no headers, and every
client writes the Content-Type's boundary there (a body that disagrees with its header is
then the replica's Starlette's to refuse, in vLLM's words).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# RFC 2046 bchars, 1 to 70 of them, not ending in a space.
_BOUNDARY = re.compile(rb"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_PARAM = re.compile(rb';\s*([A-Za-z*]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))')
# A text field longer than this is no routing field: kept out of `fields`, not refused.
_FIELD_LIMIT = 65536
_HEAD_LIMIT = 8192


class MalformedMultipart(ValueError):
    """The body is not multipart/form-data this reader accepts; the message says why."""


@dataclass(frozen=True, slots=True)
class Form:
    """The text fields (first value of each name) and the file parts' names and sizes."""

    fields: dict[str, str]
    files: dict[str, int]


def _disposition(head: bytes) -> tuple[str, bool]:
    """(name, has filename) of a part's Content-Disposition: form-data header."""
    for line in head.split(b"\r\n"):
        key, sep, value = line.partition(b":")
        if not sep or key.strip().lower() != b"content-disposition":
            continue
        kind, _, params = value.strip().partition(b";")
        if kind.strip().lower() != b"form-data":
            raise MalformedMultipart("a part's Content-Disposition is not form-data")
        found = {
            m[1].lower(): (m[2] if m[2] is not None else m[3])
            for m in _PARAM.finditer(b";" + params)
        }
        name = found.get(b"name")
        if not name:
            raise MalformedMultipart('a part\'s Content-Disposition has no "name"')
        return name.decode("utf-8", "replace"), b"filename" in found or b"filename*" in found
    raise MalformedMultipart("a part has no Content-Disposition header")


def parse_form(body: bytes) -> Form:
    """The form in `body`; MalformedMultipart when it is not well-formed multipart."""
    if not body.startswith(b"--"):
        raise MalformedMultipart("the body does not start with a multipart boundary")
    eol = body.find(b"\r\n")
    if eol < 0:
        raise MalformedMultipart("the body ends inside its first boundary line")
    boundary = body[2:eol].rstrip(b" \t")
    if not _BOUNDARY.fullmatch(boundary):
        raise MalformedMultipart("the multipart boundary is not 1-70 valid characters")
    delimiter = b"\r\n--" + boundary
    fields: dict[str, str] = {}
    files: dict[str, int] = {}
    at = eol + 2
    while True:
        head_end = body.find(b"\r\n\r\n", at, at + _HEAD_LIMIT)
        if head_end < 0:
            # A part without headers has a blank line at once.
            if body.startswith(b"\r\n", at):
                head_end = at - 2
            else:
                raise MalformedMultipart("a part's headers do not end")
        head = body[at:head_end] if head_end >= at else b""
        name, is_file = _disposition(head)
        start = head_end + 4
        end = body.find(delimiter, start)
        if end < 0:
            raise MalformedMultipart("the body ends before its closing boundary")
        if is_file:
            files.setdefault(name, end - start)
        elif end - start <= _FIELD_LIMIT and name not in fields:
            try:
                fields[name] = body[start:end].decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedMultipart(f"the field {name!r} is not UTF-8") from None
        at = end + len(delimiter)
        if body.startswith(b"--", at):
            return Form(fields, files)  # the closing delimiter; an epilogue may follow
        # Transport padding (RFC 2046) may follow a delimiter before its CRLF.
        while body.startswith((b" ", b"\t"), at):
            at += 1
        if not body.startswith(b"\r\n", at):
            raise MalformedMultipart("a boundary line does not end with CRLF")
        at += 2
