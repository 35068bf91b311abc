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
#          holds the file (a tool that could not start says why there too);
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
#
# CMDs `:net-up NETNS PID HOSTIF HOST GUEST RATE` and `:net-down HOSTIF NETNS` make and remove a
# machine's network over rtnetlink in this process, as `Net.ts` describes (four `ip` and `tc`
# runs at a machine's start and one at its end before; answered `exit 0`, or `exit 1` with the
# step that failed and why as STDERR).
#
# CMD `:sealed PROGRAM CMD ARG...` starts CMD ARG... as any tool, with PROGRAM (looked up in the
# PATH of ENV) on its descriptor 3: a sealed in-memory copy, made at first use and again whenever
# the file changes, which the tool may run (`/proc/self/fd/3`). crun run from its file copies itself
# into memory and starts again from the copy on every start, so that no container can write to
# the host's crun (CVE-2019-5736); from a sealed copy it skips both, ~4.5 ms of every machine's
# start. Where the kernel makes no executable memfd, descriptor 3 is the file itself.
import errno
import fcntl
import os
import selectors
import signal

# A terminal's Ctrl-C reaches the whole process group: the host agent may still need tools to
# remove its machines as it shuts down, so this process ends only when its parent does.
signal.signal(signal.SIGINT, signal.SIG_IGN)
DEFAULTED = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
MFD_EXEC = 0x10  # linux/memfd.h; not in Python 3.11's os


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


class Netlink:
    """A machine's network made and removed over rtnetlink in this process, as `ip` and `tc` would
    make it, with no program started (four at a machine's start and one at its end took ~35 ms of
    host CPU a machine in all)."""

    # rtnetlink (linux/rtnetlink.h, if_link.h, if_addr.h, pkt_sched.h)
    NEWLINK, DELLINK, NEWADDR, NEWROUTE, NEWQDISC = 16, 17, 20, 24, 36
    REQUEST, ACK, REPLACE, EXCL, CREATE = 0x1, 0x4, 0x100, 0x200, 0x400
    ERROR = 2
    IFLA_IFNAME, IFLA_LINKINFO, IFLA_NET_NS_FD = 3, 18, 28
    INFO_KIND, INFO_DATA, VETH_PEER = 1, 2, 1
    IFA_ADDRESS, IFA_LOCAL = 1, 2
    RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_METRICS, RTAX_QUICKACK = 1, 4, 5, 8, 15
    TCA_KIND, TCA_OPTIONS, TBF_PARMS, TBF_RATE64, TBF_BURST = 1, 2, 1, 4, 6
    IFF_UP, AF_INET, MAIN, BOOT, SCOPE_LINK, UNICAST, ROOT = 1, 2, 254, 3, 253, 1, 0xFFFFFFFF
    CLONE_NEWNET, MS_BIND, MS_REC, MS_SHARED, MNT_DETACH = 0x40000000, 0x1000, 0x4000, 0x100000, 2
    RUN_DIR = b"/run/netns"

    def __init__(self):
        import ctypes
        import socket
        import struct

        self.socket_module, self.struct = socket, struct
        libc = ctypes.CDLL(None, use_errno=True)
        libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
        text = ctypes.c_char_p
        libc.mount.argtypes = [text, text, text, ctypes.c_ulong, ctypes.c_void_p]
        libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.libc, self.ctypes = libc, ctypes
        self.home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.host = self.netlink()
        self.seq = 0
        self.shared = False
        # tc's clock: ticks of the packet scheduler a microsecond (tc_core_init).
        t2us, us2t, resolution = (int(x, 16) for x in open("/proc/net/psched").read().split()[:3])
        if resolution == 1_000_000_000:
            t2us = us2t
        self.ticks_per_usec = t2us / us2t * (resolution / 1_000_000)

    def netlink(self):
        s = self.socket_module
        sock = s.socket(s.AF_NETLINK, s.SOCK_RAW | s.SOCK_CLOEXEC, s.NETLINK_ROUTE)
        sock.bind((0, 0))
        return sock

    def fail(self, what):
        e = self.ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")

    def attr(self, kind, data):
        size = 4 + len(data)
        return self.struct.pack("=HH", size, kind) + data + b"\0" * (-size % 4)

    def name(self, kind, text):
        return self.attr(kind, text.encode() + b"\0")

    def address(self, kind, dotted):
        return self.attr(kind, self.socket_module.inet_aton(dotted))

    def ask(self, sock, kind, flags, body, what):
        """Sends one request and waits for its acknowledgement; a refusal raises with `what`."""
        self.seq += 1
        flags |= self.REQUEST | self.ACK
        sock.send(self.struct.pack("=IHHII", 16 + len(body), kind, flags, self.seq, 0) + body)
        while True:
            data = sock.recv(65536)
            at = 0
            while at + 16 <= len(data):
                size, mtype, _, seq, _ = self.struct.unpack_from("=IHHII", data, at)
                if mtype == self.ERROR and seq == self.seq:
                    (code,) = self.struct.unpack_from("=i", data, at + 16)
                    if code < 0:
                        raise OSError(-code, f"{what}: {os.strerror(-code)}")
                    return
                at += (size + 3) & ~3

    def u32(self, kind, value):
        return self.attr(kind, self.struct.pack("=I", value))

    def link(self, index=0, flags=0, change=0):
        return self.struct.pack("=BxHiII", 0, 0, index, flags, change)

    def route(self, dst_len, scope):
        """An IPv4 unicast route of the main table, as `ip route add` makes it (protocol boot)."""
        fields = (self.AF_INET, dst_len, 0, 0, self.MAIN, self.BOOT, scope, self.UNICAST, 0)
        return self.struct.pack("=BBBBBBBBI", *fields)

    def up(self, sock, index, what):
        self.ask(sock, self.NEWLINK, 0, self.link(index, self.IFF_UP, self.IFF_UP), what)

    def add_address(self, sock, index, dotted, what):
        body = self.struct.pack("=BBBBI", self.AF_INET, 30, 0, 0, index)
        body += self.address(self.IFA_LOCAL, dotted) + self.address(self.IFA_ADDRESS, dotted)
        self.ask(sock, self.NEWADDR, self.CREATE | self.EXCL, body, what)

    def tbf(self, sock, index, rate, what):
        """`tc qdisc replace dev D root tbf rate RATEbps burst BURST latency 50ms`, as tc sends it."""
        burst = max(65536, -(-rate // 50))
        limit = int(rate * 50_000 / 1_000_000 + burst)
        ticks = int(1_000_000 * (burst / min(rate, 0xFFFFFFFF)) * self.ticks_per_usec)
        # tc_ratespec: cell_log, linklayer (ethernet), overhead, cell_align, mpu, rate
        spec = self.struct.pack("=BBHhHI", 3, 1, 0, -1, 0, min(rate, 0xFFFFFFFF))
        parms = spec + bytes(12) + self.struct.pack("=III", limit, ticks, 0)
        options = self.attr(self.TBF_PARMS, parms) + self.u32(self.TBF_BURST, burst)
        if rate >= 1 << 32:
            options += self.attr(self.TBF_RATE64, self.struct.pack("=Q", rate))
        body = self.struct.pack("=BxxxiIII", 0, index, 0, self.ROOT, 0)
        body += self.name(self.TCA_KIND, "tbf") + self.attr(self.TCA_OPTIONS, options)
        self.ask(sock, self.NEWQDISC, self.CREATE | self.REPLACE, body, what)

    def attach(self, netns, pid):
        """`ip netns attach NETNS PID`: the netns of process PID, bind-mounted on /run/netns/NETNS."""
        os.makedirs(self.RUN_DIR, 0o755, exist_ok=True)
        # As ip does: the folder a shared mount, so a removal in one mount namespace is seen in all.
        if not self.shared:
            shared = self.MS_SHARED | self.MS_REC
            if self.libc.mount(b"", self.RUN_DIR, b"none", shared, None) != 0:
                if self.libc.mount(self.RUN_DIR, self.RUN_DIR, b"none", self.MS_BIND | self.MS_REC, None) != 0:
                    self.fail("mount --bind /run/netns")
                if self.libc.mount(b"", self.RUN_DIR, b"none", shared, None) != 0:
                    self.fail("mount --make-rshared /run/netns")
            self.shared = True
        path = os.path.join(self.RUN_DIR, netns)
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
        source = f"/proc/{pid.decode()}/ns/net".encode()
        if self.libc.mount(source, path, b"none", self.MS_BIND, None) != 0:
            try:
                self.fail(f"netns attach {netns.decode()} {pid.decode()}")
            finally:
                os.unlink(path)

    def make(self, netns, pid, host_if, host_address, guest_address, rate):
        """Net.ts `up`: the netns, the veth pair, addresses, links up, routes and shaping."""
        if pid:
            self.attach(netns, pid)
        ns = os.open(os.path.join(self.RUN_DIR, netns), os.O_RDONLY | os.O_CLOEXEC)
        inside = None
        try:
            h = host_if.decode()
            peer = self.link() + self.name(self.IFLA_IFNAME, "eth0") + self.u32(self.IFLA_NET_NS_FD, ns)
            veth = self.attr(self.INFO_DATA, self.attr(self.VETH_PEER, peer))
            info = self.name(self.INFO_KIND, "veth") + veth
            body = self.link() + self.name(self.IFLA_IFNAME, h) + self.attr(self.IFLA_LINKINFO, info)
            self.ask(self.host, self.NEWLINK, self.CREATE | self.EXCL, body, f"link add {h}")
            index = self.socket_module.if_nametoindex(h)
            self.add_address(self.host, index, host_address.decode(), f"addr add dev {h}")
            self.up(self.host, index, f"link set {h} up")
            guest = guest_address.decode()
            route = self.route(32, self.SCOPE_LINK) + self.address(self.RTA_DST, guest)
            route += self.u32(self.RTA_OIF, index) + self.attr(self.RTA_METRICS, self.u32(self.RTAX_QUICKACK, 1))
            self.ask(self.host, self.NEWROUTE, self.CREATE | self.EXCL, route, f"route add {guest}")
            # A socket made in the machine's netns stays there: made, and back home at once.
            if self.libc.setns(ns, self.CLONE_NEWNET) != 0:
                self.fail(f"setns {netns.decode()}")
            try:
                inside = self.netlink()
                eth0, lo = (self.socket_module.if_nametoindex(name) for name in ("eth0", "lo"))
            finally:
                if self.libc.setns(self.home, self.CLONE_NEWNET) != 0:
                    os._exit(70)  # in another netns for good: no tool may start here
            self.add_address(inside, eth0, guest, "addr add dev eth0")
            self.up(inside, lo, "link set lo up")
            self.up(inside, eth0, "link set eth0 up")
            default = self.route(0, 0) + self.address(self.RTA_GATEWAY, host_address.decode())
            self.ask(inside, self.NEWROUTE, self.CREATE | self.EXCL, default, "route add default")
            if rate:
                self.tbf(self.host, index, int(rate), f"qdisc {h} tbf")
                self.tbf(inside, eth0, int(rate), "qdisc eth0 tbf")
        finally:
            os.close(ns)
            if inside is not None:
                inside.close()

    def remove(self, host_if, netns):
        """Net.ts `down`: the veth pair (both ends) and the netns; a part already gone is fine."""
        failed = None
        try:
            body = self.link() + self.name(self.IFLA_IFNAME, host_if.decode())
            self.ask(self.host, self.DELLINK, 0, body, f"link del {host_if.decode()}")
        except OSError as e:
            if e.errno != errno.ENODEV:
                failed = e
        path = os.path.join(self.RUN_DIR, netns)
        self.libc.umount2(path, self.MNT_DETACH)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if failed:
            raise failed


nft = None


def nft_script(tid, script):
    global nft
    try:
        nft = nft or Nft()
    except OSError as e:
        return answer(tid, "error", b"libnftables: " + str(e).encode())
    code, error = nft.run(script)
    answer(tid, "exit", str(code), b"", error)


net = None


def network(tid, make, args):
    global net
    try:
        net = net or Netlink()
        (net.make if make else net.remove)(*args)
    except OSError as e:
        where = "" if e.filename is None else f": {os.fsdecode(e.filename)}"
        return answer(tid, "exit", "1", b"", f"{e.strerror}{where}".encode())
    except (TypeError, ValueError) as e:  # the wrong number of arguments, a rate not a number
        return answer(tid, "exit", "1", b"", str(e).encode())
    answer(tid, "exit", "0", b"", b"")


sealed_copies = {}  # path => (the file's identity, the descriptor of its sealed copy)


def sealed(path):
    """A descriptor (close-on-exec, above 9) of a sealed in-memory copy of the program at PATH, the
    one kept while the file is unchanged; or of the file itself where no such copy can be made."""
    info = os.stat(path)
    identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    kept = sealed_copies.get(path)
    if kept and kept[0] == identity:
        return kept[1]
    # (A file replaced between the look and the copy is copied again at the next call: its identity
    # then differs from the one kept.)
    with open(path, "rb") as f:
        try:
            made = memfd(os.path.basename(path))
            try:
                while os.sendfile(made, f.fileno(), None, 1 << 30) > 0:
                    pass
                seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
                fcntl.fcntl(made, fcntl.F_ADD_SEALS, seals)
            except OSError:
                os.close(made)
                raise
        except OSError:
            made = os.dup(f.fileno())  # executable memfds turned off (vm.memfd_noexec): the file
        # Above the descriptors a tool's actions name (0-3), so a dup2 onto 3 never finds it there.
        fd = fcntl.fcntl(made, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(made)
    if kept:
        os.close(kept[1])
    sealed_copies[path] = (identity, fd)
    return fd


def memfd(name):
    """An executable memfd that can be sealed: MFD_EXEC said, as Linux >= 6.3 wants (older kernels
    refuse the flag, and their memfds are executable)."""
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    try:
        return os.memfd_create(name, flags | MFD_EXEC)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return os.memfd_create(name, flags)


def open_log(log):
    """The tool's log, opened to append (made if missing)."""
    return os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)


def not_started(tid, log, why):
    """Answers that a tool could not start; with a LOG, says why there too (what its reader sees)."""
    if log:
        try:
            fd = open_log(log)
            try:
                os.write(fd, why + b"\n")
            finally:
                os.close(fd)
        except OSError:
            pass  # the answer still says it
    answer(tid, "error", why)


def start(tid, log, data, env, cmd, *args):
    if cmd == b":nft":
        return nft_script(tid, data)
    if cmd in (b":net-up", b":net-down"):
        return network(tid, cmd == b":net-up", args)
    if env:
        environment = dict(e.split(b"=", 1) if b"=" in e else (e, b"") for e in env[1:].split(b"\0") if e)
        environment = {k: v for k, v in environment.items() if k}
    else:
        environment = os.environb
    opened = []
    try:
        extra = []
        if cmd == b":sealed":
            if len(args) < 2:
                raise ValueError("no program, or no command")
            program, cmd, *args = args
            try:
                extra = [(os.POSIX_SPAWN_DUP2, sealed(found(program, environment)), 3)]
            except OSError as e:  # nothing opened yet
                return not_started(tid, log, b"spawn " + cmd + b": " + program + b" " + errno_name(e).encode())
        if log:
            out = open_log(log)
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
            file_actions=actions + extra,
            # Some are ignored here (by Python, above, or by whoever started the host agent): a tool
            # starts with every signal at its default, and none blocked.
            setsigdef=DEFAULTED,
            setsigmask=(),
        )
    except (OSError, ValueError) as e:  # ValueError: a NUL in an argument or the environment
        for fd in opened:
            os.close(fd)
        return not_started(tid, log, b"spawn " + cmd + b" " + errno_name(e).encode())
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
