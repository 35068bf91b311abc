#!/usr/bin/python3
"""Makes an idmapped, read-only bind mount: idmap-mount.py SOURCE TARGET HOST_ID COUNT

Files owned by id N under SOURCE appear under TARGET as owned by HOST_ID + N (N < COUNT), so a
machine whose root is mapped to HOST_ID sees the shared base as its own, and the base on disk stays
owned by the host's root. Debian 12's mount(8) has no X-mount.idmap (util-linux 2.39), hence this
helper; it uses the kernel's mount API (Linux >= 5.12) through ctypes and nothing else.
"""
import ctypes
import os
import sys
import time

SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # x86_64 and aarch64 alike
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE = 1, 0o2000000, 0x8000
AT_EMPTY_PATH, AT_FDCWD, MOVE_MOUNT_F_EMPTY_PATH = 0x1000, -100, 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_IDMAP = 0x1, 0x2, 0x4, 0x100000
CLONE_NEWUSER = 0x10000000


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def checked(result, what):
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def main(source, target, host_id, count):
    # A child process holds a user namespace with the mapping; its namespace file is what
    # mount_setattr takes. The child waits on a pipe and exits when this process is done.
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(write_end)
        if libc.unshare(CLONE_NEWUSER) != 0:
            os._exit(1)
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    try:
        own = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{child}/ns/user") == own:
            if time.monotonic() > deadline:
                raise OSError("the mapping process did not make its user namespace")
            time.sleep(0.0002)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child}/{name}", "w") as f:
                f.write(f"0 {host_id} {count}\n")
        userns = os.open(f"/proc/{child}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        tree = checked(
            libc.syscall(SYS_OPEN_TREE, AT_FDCWD, source.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE),
            f"open_tree {source}",
        )
        attr = MountAttr(MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV, 0, 0, userns)
        checked(
            libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)),
            "mount_setattr",
        )
        checked(
            libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH),
            f"move_mount {target}",
        )
    finally:
        os.close(write_end)
        os.waitpid(child, 0)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: idmap-mount.py SOURCE TARGET HOST_ID COUNT")
    try:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    except OSError as e:
        sys.exit(f"idmap-mount: {e}")
