"""vLLM's speech-to-text routes (/v1/audio/transcriptions, /v1/audio/translations) through
the gateway: multipart bodies, relayed as received.

An audio request leaves no text prefix to come back to (Whisper's decoder prompt is a few
task tokens; the encoder's input is the audio): no cache features, placed by load on the
replicas serving its model. Only `model`, `stream` and the file's presence are read here;
the replica validates the rest of the form (vLLM's TranscriptionRequest / TranslationRequest).
"""

from __future__ import annotations

from gateway.errors import BadRequest, echo
from gateway.proxy.multipart import Form, MalformedMultipart, parse_form

# pydantic's lax booleans, as vLLM reads the form's `stream`.
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def read_form(body: bytes) -> tuple[Form, str, bool]:
    """(form, model, stream) of an audio request; BadRequest for what cannot be routed."""
    try:
        form = parse_form(body)
    except MalformedMultipart as exc:
        raise BadRequest(f"Invalid multipart/form-data body: {exc}.") from None
    if "file" not in form.files:
        raise BadRequest("`file` is required: an audio file part named `file`.", param="file")
    model = form.fields.get("model", "")
    if not model:
        raise BadRequest("`model` is required and must be a non-empty string.", param="model")
    raw = form.fields.get("stream", "false").strip().lower()
    if raw not in _TRUE | _FALSE:
        raise BadRequest(f"`stream` must be a boolean, not {echo(raw)!r}.", param="stream")
    return form, model, raw in _TRUE
