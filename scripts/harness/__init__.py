"""What the programs in scripts/ share: grading the exercises and posting the report
(grading, discord), the ladder's rungs (rungs) and the naive baselines that bench.py and
bench_decode.py compare against (naive_step), and the flags of a child on simulated CPU
devices (below). The programs themselves stay in scripts/."""


def simulated_cpu_flags(devices, flags=None):
    """XLA_FLAGS for a child process on `devices` simulated CPU devices. `flags`, the
    caller's own (a dump folder, the suite's compile level), are kept; the device count
    goes after them, as of a flag given twice the last wins."""
    return f"{flags or ''} --xla_force_host_platform_device_count={devices}".strip()
