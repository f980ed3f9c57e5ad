"""A trace's events decoded straight into typed records, without a dict per event.

``orjson.loads`` builds a dict per event, and a dict per event's ``args``, with every key
the trace writes; the columns then visit each dict again. msgspec decodes the same text
into small slotted records that hold only the fields stepscope reads (unknown keys are
skipped while decoding, never built), about twice as fast as orjson builds the dicts,
and the columns are read from the records' attributes. The shapes that the FLOP counting
reads stay undecoded (``msgspec.Raw``, a slice of the text) until an operator needs them.

The types are loose where traces are (``Any``: a number written as a string, a string
pid), and strict where the columns' code assumes a shape (``args`` is an object or
null). A trace that does not fit (an ``args`` array, a bare ``N/A``, not JSON at all)
is not an error here: the caller reads it the dict way, which tolerates or names it.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

_NO_SHAPE = msgspec.Raw()


class Args(msgspec.Struct, gc=False):
    """The ``args`` fields the columns read; a missing one is its column's default."""

    correlation: Any = -1
    external_id: Any = msgspec.field(name="External id", default=-1)
    #: tb-profiler era traces spell it in lower case
    external_id_lower: Any = msgspec.field(name="external id", default=-1)
    stream: Any = -1
    device: Any = -1
    blocks_per_sm: Any = msgspec.field(name="blocks per SM", default=math.nan)
    occupancy: Any = msgspec.field(name="est. achieved occupancy %", default=math.nan)
    device_type: Any = msgspec.field(name="Device Type", default=-1)
    device_id: Any = msgspec.field(name="Device Id", default=-1)
    nbytes: Any = msgspec.field(name="Bytes", default=0)
    total_allocated: Any = msgspec.field(name="Total Allocated", default=-1)
    total_reserved: Any = msgspec.field(name="Total Reserved", default=-1)
    addr: Any = msgspec.field(name="Addr", default=-1)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_NO_SHAPE)
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=_NO_SHAPE)
    concrete_inputs: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=_NO_SHAPE)
    sequence_number: Any = msgspec.field(name="Sequence number", default=None)

    def external(self) -> Any:
        return self.external_id if self.external_id != -1 else self.external_id_lower


#: An event without ``args`` (or with ``"args": null``) reads every default.
NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = ""
    ts: Any = 0
    dur: Any = 0
    pid: Any = -1
    tid: Any = -1
    args: Args | None = None


class Document(msgspec.Struct):
    """The trace's top level: its events and the metadata the loader keeps."""

    traceEvents: list[Event] | None = None  # noqa: N815 (Kineto's key)
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    schemaVersion: Any = None  # noqa: N815
    displayTimeUnit: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815


_DOCUMENT = msgspec.json.Decoder(Document)
_EVENTS = msgspec.json.Decoder(list[Event])


def decode_document(data: bytes | bytearray) -> tuple[dict[str, Any], list[Event]] | None:
    """The metadata and the events of a Kineto trace's text; None when the text is not
    one that this typed reading fits (the caller then reads it the dict way)."""
    try:
        doc = _DOCUMENT.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    events = doc.traceEvents
    if not events or not any(e.ph is not None for e in events[:100]):
        return None
    meta = {
        "deviceProperties": doc.deviceProperties,
        "distributedInfo": doc.distributedInfo,
        "schemaVersion": doc.schemaVersion,
        "displayTimeUnit": doc.displayTimeUnit,
        "baseTimeNanoseconds": doc.baseTimeNanoseconds,
    }
    return meta, events


def decode_events(data: bytes | bytearray) -> list[Event] | None:
    """A JSON array of events (a piece of a big trace); None when it does not fit."""
    try:
        return _EVENTS.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def shape(raw: msgspec.Raw) -> Any:
    """An undecoded shape field as the dict reading would hold it (None: absent)."""
    return msgspec.json.decode(raw) if len(raw) else None


__all__ = ["NO_ARGS", "Args", "Event", "decode_document", "decode_events", "shape"]
