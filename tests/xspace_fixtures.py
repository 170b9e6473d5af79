"""Profiler traces shaped as each runtime writes them, for tests that cannot
run on the chip itself: planes, lines, events and stats by name, written as a
real `.xplane.pb` through jaxlib's own compiled XSpace proto
(`jax.profiler.ProfileData.text_proto_to_serialized_xspace`), so the reader
under test (roofline/measured/xspace.py, its own copy of the schema) reads bytes it
did not write.

As the runtimes do (xla/tsl/profiler/utils/xplane_builder.h), an event's
name and the stats every occurrence shares sit on its metadata; a string stat
may be written as a reference to a stat metadata named by the value (`Ref`);
a line's events are offsets from the line's timestamp_ns.

    plane = Plane("/device:TPU:0")
    ops = plane.line("XLA Ops", timestamp_ns=500_000)
    ops.event("fusion.1", start_us=5, duration_us=400, metadata_stats={"hlo_category": "loop fusion"})
    write_run(tmp_path, {"host0": [plane, ...]})  # -> the logdir
"""

import os

from jax.profiler import ProfileData


class U(int):
    """A stat written as uint64_value (run_id and correlation_id are)."""


class Ref(str):
    """A stat written as ref_value: a stat metadata named by the value, as
    XStatsBuilder::ParseAndAddStatValue writes a string that is not a number."""


def _quote(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class Line:
    def __init__(self, plane, line_id, name, timestamp_ns):
        self.plane, self.id, self.name, self.timestamp_ns = plane, line_id, name, timestamp_ns
        self.events = []  # text of each event

    def event(
        self, name, start_us, duration_us, stats=None, *, display_name="", metadata_stats=None
    ):
        """An event from start_us to start_us + duration_us, microseconds since the
        profile began (written as picoseconds after the line's timestamp)."""
        metadata = self.plane.metadata(name, display_name, metadata_stats or {})
        offset_ps = round(start_us * 1e6) - self.timestamp_ns * 1000
        assert offset_ps >= 0, "an event before its line's timestamp"
        self.events.append(
            f"events {{ metadata_id: {metadata} offset_ps: {offset_ps} "
            f"duration_ps: {round(duration_us * 1e6)} "
            f"{self.plane.stats_text(stats or {})}}}"
        )

    def text(self):
        return (
            f"lines {{ id: {self.id} name: {_quote(self.name)} "
            f"timestamp_ns: {self.timestamp_ns}\n  " + "\n  ".join(self.events) + " }"
        )


class Plane:
    """One XPlane: lines of events, event and stat metadata, plane stats."""

    def __init__(self, name, stats=None):
        self.name, self.plane_stats = name, stats or {}
        self.lines, self.stat_ids, self.event_metadata = [], {}, {}

    def stat_id(self, name):
        return self.stat_ids.setdefault(name, len(self.stat_ids) + 1)

    def stats_text(self, stats):
        out = []
        for name, value in stats.items():
            key = self.stat_id(name)
            if isinstance(value, Ref):
                out.append(f"stats {{ metadata_id: {key} ref_value: {self.stat_id(value)} }}")
            elif isinstance(value, U):
                out.append(f"stats {{ metadata_id: {key} uint64_value: {int(value)} }}")
            elif isinstance(value, int):  # bool too
                out.append(f"stats {{ metadata_id: {key} int64_value: {int(value)} }}")
            elif isinstance(value, float):
                out.append(f"stats {{ metadata_id: {key} double_value: {value!r} }}")
            else:
                out.append(f"stats {{ metadata_id: {key} str_value: {_quote(value)} }}")
        return " ".join(out) + (" " if out else "")

    def metadata(self, name, display_name, stats):
        """The id of the event metadata named `name`, made on first use; later
        uses must agree with the first (metadata is shared)."""
        if name not in self.event_metadata:
            self.event_metadata[name] = (
                len(self.event_metadata) + 1,
                display_name,
                self.stats_text(stats),
            )
        key, display, text = self.event_metadata[name]
        assert (display, text) == (display_name, self.stats_text(stats)), name
        return key

    def line(self, name, timestamp_ns=0, line_id=None):
        line = Line(
            self, line_id if line_id is not None else len(self.lines) + 1, name, timestamp_ns
        )
        self.lines.append(line)
        return line

    def text(self, plane_id):
        plane_stats = self.stats_text(self.plane_stats)  # may add stat metadata: first
        events = [
            f"event_metadata {{ key: {k} value {{ id: {k} name: {_quote(n)} "
            + (f"display_name: {_quote(d)} " if d else "")
            + f"{s}}} }}"
            for n, (k, d, s) in self.event_metadata.items()
        ]
        stats = [
            f"stat_metadata {{ key: {k} value {{ id: {k} name: {_quote(n)} }} }}"
            for n, k in self.stat_ids.items()
        ]
        body = [line.text() for line in self.lines] + events + stats
        return (
            f"planes {{ id: {plane_id} name: {_quote(self.name)}\n "
            + "\n ".join(body)
            + f"\n {plane_stats}}}"
        )


def write_run(logdir, hosts, timestamp="2026_01_01_00_00_00"):
    """Writes {host name: [Plane]} where jax.profiler would, one .xplane.pb per
    host under LOGDIR/plugins/profile/<timestamp>/; returns that run directory."""
    run_dir = os.path.join(str(logdir), "plugins", "profile", timestamp)
    os.makedirs(run_dir, exist_ok=True)
    for host, planes in hosts.items():
        text = "\n".join(p.text(i) for i, p in enumerate(planes))
        with open(os.path.join(run_dir, f"{host}.xplane.pb"), "wb") as f:
            f.write(ProfileData.text_proto_to_serialized_xspace(text))
    return run_dir
