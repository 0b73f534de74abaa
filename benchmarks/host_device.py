"""Host time against device time of marked work, from one torch profile.

Why: on the GPU the protected layer was bound by its launches, not by the GPU (2026-11-28: a
rotation 5.3 ms for ~50 launches and ~90 torch ops, ~80-100 µs each with its Python). Whether the
next lever is fewer launches, CUDA graphs or faster kernels depends on how much of a message's
host time the device spends computing; a lent GPU's minutes go further when one step answers it.

Wrap the work in ``marked(name)``, profile it (``activities(device)``), and ``summarize`` the
profile's events: for all the marked ranges together, their host seconds, the device seconds of
the kernels launched inside them (Triton's and torch's; kineto ties each kernel to the op or range
that launched it), the share of the host time the device was busy, the kernel launches, the torch
ops called from Python (the top-level ``aten::`` ops inside a range; the ops they call are not
counted again), and the kernels and ops that take the most; beside them, the whole profile's
device kernels and seconds, tied to a range or not. On a CPU the device figures are zero and
the host time and the op counts are still measured.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, record_function

PREFIX = "veil::marked::"


def marked(name: str) -> contextlib.AbstractContextManager:
    """A profiler range that ``summarize`` counts (free when no profiler runs)."""
    return record_function(PREFIX + name)


def activities(device: str) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def _marked_ancestor(e):
    """The marked range ``e`` runs in, and whether an ``aten::`` op lies between them."""
    nested, p = False, e.cpu_parent
    while p is not None:
        if p.name.startswith(PREFIX):
            return p, nested
        nested = nested or p.name.startswith("aten::")
        p = p.cpu_parent
    return None, nested


def summarize(events, top: int = 8) -> dict:
    """The marked ranges' figures (module doc) from ``profile.events()``."""
    cpu = [(e, *_marked_ancestor(e)) for e in events if e.device_type == DeviceType.CPU]
    # a range inside another counts once, as part of the outer one
    ranges = [e for e, outer, _ in cpu if outer is None and e.name.startswith(PREFIX)]
    inside = [e for e, outer, _ in cpu if outer is not None]
    ops = Counter(e.name for e, outer, nested in cpu if outer is not None and not nested and e.name.startswith("aten::"))
    kernel_time: Counter = Counter()
    kernel_count: Counter = Counter()
    for e in [*ranges, *inside]:
        for k in e.kernels:  # the device kernels this op or range launched itself
            kernel_time[k.name] += k.duration
            kernel_count[k.name] += 1
    host_s = sum(r.time_range.elapsed_us() for r in ranges) / 1e6
    device_s = sum(kernel_time.values()) / 1e6
    # every device kernel of the profile, marked or not (the client's too): what the device did
    # whether or not the profiler tied each kernel to the range that launched it
    device = [e for e in events if e.device_type != DeviceType.CPU]
    return {
        "profile_kernels": len(device),
        "profile_device_s": sum(e.time_range.elapsed_us() for e in device) / 1e6,
        "ranges": len(ranges),
        "host_s": host_s,
        "device_s": device_s,
        "device_busy_share": device_s / host_s if host_s else 0.0,
        "kernels": sum(kernel_count.values()),
        "torch_ops": sum(ops.values()),
        "top_kernels_s": {n: t / 1e6 for n, t in kernel_time.most_common(top)},
        "top_kernels_count": {n: kernel_count[n] for n, _ in kernel_time.most_common(top)},
        "top_ops": dict(ops.most_common(top)),
    }
