"""An emulated CPU power sysfs tree per edge node: this VM exposes no cpufreq
(`/sys/devices/system/cpu/cpufreq` does not exist here, docs/power.md), so the loop gives each
edge's agent a directory laid out as the kernel lays it out, under the run's state dir, and the
agent's power module (`[power] cpufreq_root`, `cpuidle_root`) writes and reads it back as it
would the kernel's. Nothing here changes a real CPU's frequency or idle states: the report says
the power lever acted on an emulated tree.

Layout (Documentation/admin-guide/pm/cpufreq.rst and cpuidle.rst, as the agent's own fake in
actuators/node-agent/src/power/tests.rs builds it):

    <root>/cpu/cpufreq/policyN/{affected_cpus, related_cpus, cpuinfo_min_freq, cpuinfo_max_freq,
        cpuinfo_transition_latency, scaling_available_frequencies,
        scaling_available_governors, scaling_driver, scaling_governor, scaling_min_freq,
        scaling_max_freq, scaling_cur_freq, scaling_setspeed}
    <root>/cpu/cpuN/cpufreq -> ../cpufreq/policyN
    <root>/cpu/cpuN/cpuidle/stateK/{name, latency, disable}   (POLL, then haltpoll as this VM)
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# An acpi-cpufreq-like table: 1.2 .. 3.0 GHz in 300 MHz steps (kHz, as sysfs gives them).
FREQS_KHZ = (3_000_000, 2_700_000, 2_400_000, 2_100_000, 1_800_000, 1_500_000, 1_200_000)
GOVERNORS = "performance powersave userspace schedutil"
# (name, exit latency µs): the idle states this VM's kernel has (cpuidle-haltpoll)
IDLE_STATES = (("POLL", 0), ("haltpoll", 1))


@dataclass(frozen=True)
class EmulatedSysfs:
    """Where one node's emulated tree is: the two roots the agent's `[power]` section names."""

    root: Path

    @property
    def cpufreq_root(self) -> Path:
        return self.root / "cpu" / "cpufreq"

    @property
    def cpuidle_root(self) -> Path:
        return self.root / "cpu"

    def read(self, relative: str) -> str:
        """A file of the tree, relative to `cpu/` (e.g. `cpufreq/policy0/scaling_governor`)."""
        return (self.root / "cpu" / relative).read_text().strip()


def _put(directory: Path, name: str, value: object) -> None:
    (directory / name).write_text(f"{value}\n")


def write_sysfs(root: Path, cores: int | None = None) -> EmulatedSysfs:
    """A fresh tree under `root` (what was there is replaced): one cpufreq policy per core,
    governor `schedutil` at the table's top, every idle state enabled. `cores`: this machine's
    count unless given."""
    n = cores or os.cpu_count() or 1
    if n < 1:
        raise ValueError(f"an emulated sysfs tree needs at least one core, not {n}")
    shutil.rmtree(root, ignore_errors=True)
    tree = EmulatedSysfs(root)
    hi, lo = FREQS_KHZ[0], FREQS_KHZ[-1]
    for cpu in range(n):
        policy = tree.cpufreq_root / f"policy{cpu}"
        policy.mkdir(parents=True)
        for name, value in (
            ("affected_cpus", cpu), ("related_cpus", cpu),
            ("cpuinfo_min_freq", lo), ("cpuinfo_max_freq", hi),
            ("cpuinfo_transition_latency", 10_000),
            ("scaling_available_frequencies", " ".join(map(str, FREQS_KHZ))),
            ("scaling_available_governors", GOVERNORS),
            ("scaling_driver", "acpi-cpufreq"), ("scaling_governor", "schedutil"),
            ("scaling_min_freq", lo), ("scaling_max_freq", hi), ("scaling_cur_freq", hi),
            ("scaling_setspeed", "<unsupported>"),
        ):
            _put(policy, name, value)
        core = tree.cpuidle_root / f"cpu{cpu}"
        core.mkdir(parents=True, exist_ok=True)
        (core / "cpufreq").symlink_to(f"../cpufreq/policy{cpu}")
        for k, (name, latency) in enumerate(IDLE_STATES):
            state = core / "cpuidle" / f"state{k}"
            state.mkdir(parents=True)
            _put(state, "name", name)
            _put(state, "latency", latency)
            _put(state, "disable", 0)
    return tree
