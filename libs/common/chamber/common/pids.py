"""Is a process on this host still there? (Leases and embedded servers are reclaimed from dead owners only.)"""

import os


def pid_alive(pid: int) -> bool:
    """True while `pid` exists, including processes of other users (signal 0 is refused, not failed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
