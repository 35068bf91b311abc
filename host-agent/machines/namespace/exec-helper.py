# The process that starts host tools for `exec.ts`. A tool started by the host agent would be
# forked from it, copying the page tables of its hundreds of MiB (10-20 ms a tool). This helper
# starts each with posix_spawn (glibc: a vfork-like clone that shares its memory until the exec),
# so neither side copies a page table or takes copy-on-write faults afterwards. Measured with a
# `true` on the 2-core bench host: 0.5 ms of this process's CPU a tool and 1.8 ms of the tool's,
# against 3.1 ms and 5.2 ms through the perl helper it replaced, whose fork did both.
#
# Messages both ways are frames: a line `N LEN1 ... LENN` and then the N fields' bytes, back to
# back. A request is `ID LOG INPUT ENV CMD ARG...`:
#   LOG    empty: the tool's stdout and stderr are collected and answered; else a file its output
#          is appended to (stdin /dev/null), and the answer comes at its exit, whatever still
#          holds the file;
#   INPUT  the tool's stdin (pipe mode);
#   ENV    empty: this process's environment; else `=` and the exact environment as NUL-separated
#          NAME=VALUE entries (CMD is looked up in its PATH, as exec would).
# The answer is `ID exit CODE STDOUT STDERR` (CODE empty when a signal ended it) once the tool
# exited and its output ended, or `ID error MESSAGE` when it could not start. A tool's end is seen
# through its pidfd, not SIGCHLD, so no signal can be missed. This process exits when its parent
# goes (stdin ends); tools it started run on. Run as `python3 -I -S` (no site packages: 8 ms less
# to start).
#
# CMD `:nft` is no program: INPUT is run as one nft script, a transaction, as `nft -f -` would, by
# libnftables in this process (answered `exit 0`, or `exit 1` with nft's error as STDERR). An
# `nft` run cost ~11 ms of CPU, most of it the program's start and its netlink socket's setup and
# close; a script here takes 0.2-0.9 ms, and a machine's start and end each run one.
import errno
import os
import selectors
import signal

# A terminal's Ctrl-C reaches the whole process group: the host agent may still need tools to
# remove its machines as it shuts down, so this process ends only when its parent does.
signal.signal(signal.SIGINT, signal.SIG_IGN)
DEFAULTED = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}


def keep_to_self():
    """Marks every descriptor of this process but 0-2 close-on-exec, so a tool gets only what is put
    on its 0, 1 and 2: not what this process was started with, nor libnftables' netlink socket
    (opened without the flag; whoever held it could change the host's firewall as root)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the listing's own, closed by now


keep_to_self()
selector = selectors.DefaultSelector()
tools = {}  # pid => the tool's state
pending = b""


def frame(*fields):
    return b" ".join([str(len(fields)).encode()] + [str(len(f)).encode() for f in fields]) + b"\n" + b"".join(fields)


def answer(*fields):
    out = memoryview(frame(*[f if isinstance(f, bytes) else f.encode() for f in fields]))
    while out:
        try:
            out = out[os.write(1, out) :]
        except BrokenPipeError:
            os._exit(0)  # the parent is gone


def errno_name(e):
    return errno.errorcode.get(e.errno, f"errno {e.errno}") if isinstance(e, OSError) else str(e)


def found(cmd, env):
    """CMD as exec would find it in the PATH of ENV (the tool's environment)."""
    if b"/" in cmd:
        return cmd
    denied = None
    for d in env.get(b"PATH", b"/bin:/usr/bin").split(b":"):
        path = os.path.join(d or b".", cmd)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            denied = path
    raise PermissionError(errno.EACCES, "") if denied else FileNotFoundError(errno.ENOENT, "")


class Nft:
    """One libnftables context, kept: its socket and its cache of the ruleset (checked against the
    kernel's generation at every run, so other programs' changes are seen)."""

    def __init__(self):
        import ctypes  # only when a script comes: 7 ms of this process's start otherwise

        lib = ctypes.CDLL("libnftables.so.1")
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_char_p
        lib.nft_run_cmd_from_filename.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self.lib = lib
        self.ctx = lib.nft_ctx_new(0)
        if not self.ctx:
            raise OSError(errno.ENOMEM, "nft_ctx_new")
        lib.nft_ctx_buffer_output(self.ctx)
        lib.nft_ctx_buffer_error(self.ctx)
        keep_to_self()

    def run(self, script):
        # Read as a file, as `nft -f` reads one: an error names the line it is on (a script given
        # as a buffer is taken for one command line, and its errors show its first).
        fd = os.memfd_create("nft-script", os.MFD_CLOEXEC)
        try:
            os.write(fd, script)
            failed = self.lib.nft_run_cmd_from_filename(self.ctx, f"/dev/fd/{fd}".encode())
        finally:
            os.close(fd)
            keep_to_self()  # a socket it opened meanwhile
        # Each read empties its buffer for the next script.
        self.lib.nft_ctx_get_output_buffer(self.ctx)
        return (1 if failed else 0), self.lib.nft_ctx_get_error_buffer(self.ctx) or b""


nft = None


def nft_script(tid, script):
    global nft
    try:
        nft = nft or Nft()
    except OSError as e:
        return answer(tid, "error", b"libnftables: " + str(e).encode())
    code, error = nft.run(script)
    answer(tid, "exit", str(code), b"", error)


def start(tid, log, data, env, cmd, *args):
    if cmd == b":nft":
        return nft_script(tid, data)
    if env:
        environment = dict(e.split(b"=", 1) if b"=" in e else (e, b"") for e in env[1:].split(b"\0") if e)
        environment = {k: v for k, v in environment.items() if k}
    else:
        environment = os.environb
    opened = []
    try:
        if log:
            out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            opened.append(out)
            actions = [
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out, 1),
                (os.POSIX_SPAWN_DUP2, out, 2),
            ]
        else:
            # Pipes are close-on-exec: the tool keeps only what is put on 0, 1 and 2.
            in_r, in_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            opened += [in_r, in_w, out_r, out_w, err_r, err_w]
            actions = [
                (os.POSIX_SPAWN_DUP2, in_r, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
            ]
        pid = os.posix_spawn(
            found(cmd, environment),
            [cmd, *args],
            environment,
            file_actions=actions,
            # Some are ignored here (by Python, above, or by whoever started the host agent): a tool
            # starts with every signal at its default, and none blocked.
            setsigdef=DEFAULTED,
            setsigmask=(),
        )
    except (OSError, ValueError) as e:  # ValueError: a NUL in an argument or the environment
        for fd in opened:
            os.close(fd)
        return answer(tid, "error", b"spawn " + cmd + b" " + errno_name(e).encode())
    tool = tools[pid] = {"id": tid, "open": 0, "log": bool(log), "out": [], "err": [], "status": None}
    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, ("exit", pid))
    if log:
        os.close(out)
        return
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    for fd, which in ((out_r, "out"), (err_r, "err")):
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ, (which, pid))
        tool["open"] += 1
    os.set_blocking(in_w, False)
    tool["in"] = in_w
    tool["input"] = memoryview(data)
    feed(pid)


def feed(pid):
    """Writes what input is left; closes the tool's stdin once it is all written (or the tool left)."""
    tool = tools[pid]
    fd = tool.get("in")
    if fd is None:
        return
    while tool["input"]:
        try:
            tool["input"] = tool["input"][os.write(fd, tool["input"]) :]
        except BlockingIOError:
            if not tool.get("waiting"):
                selector.register(fd, selectors.EVENT_WRITE, ("in", pid))
                tool["waiting"] = True
            return
        except OSError:
            break  # EPIPE: it reads no more
    close_input(tool)


def close_input(tool):
    fd = tool.pop("in", None)
    if fd is None:
        return
    if tool.pop("waiting", False):
        selector.unregister(fd)
    os.close(fd)


def settle(pid):
    """Answers for a tool that exited and, collecting its output, whose output ended."""
    tool = tools[pid]
    if tool["status"] is None or (not tool["log"] and tool["open"] > 0):
        return
    close_input(tool)
    status = tool["status"]
    code = str(os.WEXITSTATUS(status)) if os.WIFEXITED(status) else ""
    answer(tool["id"], "exit", code, b"".join(tool["out"]), b"".join(tool["err"]))
    del tools[pid]


def requests():
    global pending
    while (eol := pending.find(b"\n")) >= 0:
        lengths = [int(n) for n in pending[:eol].split(b" ")[1:]]
        if len(pending) < eol + 1 + sum(lengths):
            return
        at = eol + 1
        fields = []
        for length in lengths:
            fields.append(pending[at : at + length])
            at += length
        pending = pending[at:]
        start(*fields)


selector.register(0, selectors.EVENT_READ, ("requests", None))
while True:
    for key, _ in selector.select():
        kind, pid = key.data
        # Handled already in this turn (a tool's end closes what it had open).
        if selector.get_map().get(key.fd) is not key:
            continue
        if kind == "requests":
            data = os.read(0, 65536)
            if not data:
                os._exit(0)  # the parent is gone
            pending += data
            requests()
        elif kind == "exit":
            selector.unregister(key.fd)
            os.close(key.fd)
            tools[pid]["status"] = os.waitpid(pid, 0)[1]
            settle(pid)
        elif kind == "in":
            feed(pid)
        else:
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            tool = tools[pid]
            if data:
                tool[kind].append(data)
                continue
            selector.unregister(key.fd)
            os.close(key.fd)
            tool["open"] -= 1
            settle(pid)
