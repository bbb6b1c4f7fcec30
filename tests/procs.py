"""Process helpers for tests that check child processes are started and stopped (Linux /proc)."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> set[int]:
    """PIDs whose parent is ``pid``."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d.name))
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
