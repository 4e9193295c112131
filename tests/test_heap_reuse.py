"""`keep_freed_buffers`: a broker's megabyte buffers, freed and allocated again, fault no new pages."""

from __future__ import annotations

import subprocess
import sys

# Three buffers of 0.5-2 MiB at a time, as a broker's requests and answers come and go; the
# minor page faults per round once the heap has seen such sizes.
PATTERN = """
import random, resource, sys
if sys.argv[1] == "kept":
    from onceflow.heap_reuse import keep_freed_buffers
    assert keep_freed_buffers()
rng = random.Random(1)
def buffers():
    held = [bytearray(rng.randrange(1 << 19, 1 << 21)) for _ in range(3)]
    del held
for _ in range(10):
    buffers()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    buffers()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 100)
"""


def faults_per_round(mode: str) -> float:
    ran = subprocess.run([sys.executable, "-c", PATTERN, mode], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return float(ran.stdout)


def test_freed_buffers_are_reused_instead_of_faulted_in_again() -> None:
    # The precondition: glibc's own thresholds give these buffers back to the kernel (about 900
    # pages a round are allocated; most of them fault again).
    assert faults_per_round("default") > 100
    assert faults_per_round("kept") < 20
