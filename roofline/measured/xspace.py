"""Read a profiler's `.xplane.pb`: the XSpace protocol buffer that every JAX
runtime (CPU, GPU, TPU) writes, and that xprof reads.

    planes = read_xspace("runs/profile/plugins/profile/<time>/<host>.xplane.pb")
    for plane in planes:                      # "/host:CPU", "/device:GPU:0", "/device:TPU:0", ...
        for line in plane.lines:              # a thread, a CUDA stream, "XLA Ops", ...
            for event in plane.events(line):  # Event(name, start_ps, duration_ps, stats)

An XSpace holds planes (the host's threads, one per device), each plane lines
(timelines), each line events. To keep the file small an event holds only a
metadata id (its name, and stats every occurrence shares) and its own stats;
a stat holds a metadata id (its name) and a value, which may be a reference
to another stat's metadata whose name is the value (a string written once).
The TPU runtime puts an op's category, program and FLOPs on the metadata and
names it by the HLO instruction's text with a short display name; the GPU
tracer writes `hlo_op` and `hlo_module` as references. `Event.stats` has
them all resolved. jax.profiler.ProfileData reads the same file but shows
neither metadata stats nor display names, hence this reader.

The schema below is tsl/profiler/protobuf/xplane.proto (in openxla/xla under
xla/tsl/profiler/protobuf/), field numbers included. The tests write their
traces with jaxlib's own compiled XSpace (ProfileData.text_proto_to_serialized_xspace)
and read them back with this one, so a wrong field number shows there.
"""

import dataclasses
import functools

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

# message -> [(field, number, type)]; "T*" is repeated, "map:T" a map from int64
# to T, "T|group" one of a oneof. Types in capitals are messages of this file.
SCHEMA = {
    "XSpace": [
        ("planes", 1, "XPlane*"),
        ("errors", 2, "string*"),
        ("warnings", 3, "string*"),
        ("hostnames", 4, "string*"),
    ],
    "XPlane": [
        ("id", 1, "int64"),
        ("name", 2, "string"),
        ("lines", 3, "XLine*"),
        ("event_metadata", 4, "map:XEventMetadata"),
        ("stat_metadata", 5, "map:XStatMetadata"),
        ("stats", 6, "XStat*"),
    ],
    "XLine": [
        ("id", 1, "int64"),
        ("display_id", 10, "int64"),
        ("name", 2, "string"),
        ("display_name", 11, "string"),
        ("timestamp_ns", 3, "int64"),
        ("duration_ps", 9, "int64"),
        ("events", 4, "XEvent*"),
    ],
    "XEvent": [
        ("metadata_id", 1, "int64"),
        ("offset_ps", 2, "int64|data"),
        ("num_occurrences", 5, "int64|data"),
        ("duration_ps", 3, "int64"),
        ("stats", 4, "XStat*"),
    ],
    "XStat": [
        ("metadata_id", 1, "int64"),
        ("double_value", 2, "double|value"),
        ("uint64_value", 3, "uint64|value"),
        ("int64_value", 4, "int64|value"),
        ("str_value", 5, "string|value"),
        ("bytes_value", 6, "bytes|value"),
        ("ref_value", 7, "uint64|value"),
    ],
    "XEventMetadata": [
        ("id", 1, "int64"),
        ("name", 2, "string"),
        ("metadata", 3, "bytes"),
        ("display_name", 4, "string"),
        ("stats", 5, "XStat*"),
        ("child_id", 6, "int64*"),
    ],
    "XStatMetadata": [("id", 1, "int64"), ("name", 2, "string"), ("description", 3, "string")],
}
PACKAGE = "tensorflow.profiler"
F = descriptor_pb2.FieldDescriptorProto


def _add_field(message, name, number, kind):
    kind, _, oneof = kind.partition("|")
    repeated = kind.endswith("*") or kind.startswith("map:")
    kind = kind.removesuffix("*")
    field = message.field.add(
        name=name, number=number, label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
    )
    if kind.startswith("map:"):  # a map is a repeated nested message {key, value}
        entry = message.nested_type.add(name="".join(p.title() for p in name.split("_")) + "Entry")
        entry.options.map_entry = True
        _add_field(entry, "key", 1, "int64")
        _add_field(entry, "value", 2, kind.removeprefix("map:"))
        field.type, field.type_name = F.TYPE_MESSAGE, f".{PACKAGE}.{message.name}.{entry.name}"
    elif kind[0].isupper():
        field.type, field.type_name = F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
    else:
        field.type = getattr(F, f"TYPE_{kind.upper()}")
    if oneof:
        names = [o.name for o in message.oneof_decl]
        if oneof not in names:
            message.oneof_decl.add(name=oneof)
            names.append(oneof)
        field.oneof_index = names.index(oneof)


@functools.cache
def xspace_class():
    """The XSpace message class, built from SCHEMA (protobuf, no generated code)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="roofline/xplane.proto", package=PACKAGE, syntax="proto3"
    )
    for name, fields in SCHEMA.items():
        message = file.message_type.add(name=name)
        for field in fields:
            _add_field(message, *field)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.XSpace"))


@dataclasses.dataclass(frozen=True)
class Event:
    name: str  # the display name if the runtime gave one (TPU: "fusion.3"), else the name
    long_name: str  # the metadata's name (TPU: the HLO instruction's text)
    start_ps: int  # picoseconds since the profile started, in the host's clock
    duration_ps: int
    stats: dict  # name -> value: the metadata's, then the event's own over them

    @property
    def end_ps(self):
        return self.start_ps + self.duration_ps


class Plane:
    """One plane of an XSpace: its name, its lines and its stats, resolved."""

    def __init__(self, proto):
        self.proto = proto
        self.name = proto.name
        self.lines = list(proto.lines)
        self.stats = self._stats(proto.stats)
        self._metadata_stats, self._stat_ids = {}, None

    def stat_value(self, stat):
        """An XStat's value; a reference is the name of the stat metadata it points
        to (tsl's XStatVisitor::StrOrRefValue, xla/tsl/profiler/utils/xplane_visitor.cc)."""
        kind = stat.WhichOneof("value")
        if kind == "ref_value":
            return self.proto.stat_metadata[stat.ref_value].name
        return getattr(stat, kind) if kind else None

    def _stats(self, stats):
        return {self.proto.stat_metadata[s.metadata_id].name: self.stat_value(s) for s in stats}

    def stat_id(self, name):
        """The metadata id of the stat called `name` in this plane, or None (one id
        per name: tsl's XPlaneBuilder::GetOrCreateStatMetadata makes it so)."""
        if self._stat_ids is None:
            self._stat_ids = {m.name: k for k, m in self.proto.stat_metadata.items()}
        return self._stat_ids.get(name)

    def events(self, line, having=None):
        """The line's events, in the order written; only those whose own stats
        include the stat called `having`, if given (a cheap filter for big lines).
        Events that aggregate occurrences (num_occurrences, no offset) are skipped."""
        wanted = self.stat_id(having) if having else None
        if having and wanted is None:
            return
        base_ps = line.timestamp_ns * 1000  # xplane_visitor.h: TimestampPs()
        for e in line.events:
            if e.WhichOneof("data") != "offset_ps":
                continue
            if wanted is not None and all(s.metadata_id != wanted for s in e.stats):
                continue
            metadata = self.proto.event_metadata[e.metadata_id]
            if e.metadata_id not in self._metadata_stats:
                self._metadata_stats[e.metadata_id] = self._stats(metadata.stats)
            stats = {**self._metadata_stats[e.metadata_id], **self._stats(e.stats)}
            yield Event(
                metadata.display_name or metadata.name,
                metadata.name,
                base_ps + e.offset_ps,
                e.duration_ps,
                stats,
            )


def read_xspace(path):
    """The planes of one `.xplane.pb` file, as Plane objects."""
    space = xspace_class()()
    with open(path, "rb") as f:
        try:
            space.ParseFromString(f.read())
        except message.DecodeError as e:
            raise ValueError(f"{path} is not a profiler trace (XSpace): {e}") from None
    return [Plane(p) for p in space.planes]
