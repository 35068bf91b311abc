/**
 * The OCI runtime configuration of a namespace machine, run by `crun` (Debian's package): what
 * makes the machine's root an unprivileged tenant on the host.
 *
 * - A user namespace maps the guest's ids 0..65535 to the machine's own host range (`hostId`), so
 *   root in the machine is an ordinary, unique uid on the host; the base is shown to it through an
 *   idmapped mount (`machine-root.pl`), never copied or chowned.
 * - pid, ipc, uts, mount, cgroup and network namespaces of its own (the driver moves the machine's
 *   veth into the network namespace before the first program starts).
 * - The capability set of Docker's default less `CAP_MKNOD` and `CAP_NET_RAW` (all of them valid
 *   only inside its own user namespace): no `CAP_SYS_ADMIN`, `SYS_MODULE`, `SYS_RAWIO`, `NET_ADMIN`.
 * - A seccomp allow-list: the default profile Podman ships (`/usr/share/containers/seccomp.json`,
 *   Debian's golang-github-containers-common), resolved for this capability set and this
 *   architecture, tightened to Docker's default where Podman's is looser: every syscall Docker
 *   allows only with `CAP_SYS_ADMIN` (mount, unshare, setns, the new mount API, keyrings, syslog…)
 *   is refused, `clone` may not make namespaces, `clone3` answers ENOSYS (libc falls back to
 *   `clone`), and io_uring is refused.
 * - Docker's masked and read-only `/proc` and `/sys` paths, plus `/proc/kallsyms`.
 * - Device access limited to the usual few (crun's defaults: null, zero, full, random, urandom,
 *   tty, ptmx, pts).
 */
import { readFileSync } from "node:fs"

/** The guest's ids 0..ID_COUNT-1 map to the machine's host range. */
export const ID_COUNT = 65536

/** Capabilities root keeps inside the machine (in its own user namespace only). */
export const capabilities: ReadonlyArray<string> = [
  "CAP_CHOWN",
  "CAP_DAC_OVERRIDE",
  "CAP_FOWNER",
  "CAP_FSETID",
  "CAP_KILL",
  "CAP_SETGID",
  "CAP_SETUID",
  "CAP_SETPCAP",
  "CAP_SETFCAP",
  "CAP_NET_BIND_SERVICE",
  "CAP_SYS_CHROOT",
  "CAP_AUDIT_WRITE",
]

/** Syscalls refused outright (EPERM) whatever the profile says: Docker's `CAP_SYS_ADMIN` set and more. */
export const refusedSyscalls: ReadonlyArray<string> = [
  "mount",
  "umount",
  "umount2",
  "unshare",
  "setns",
  "pivot_root",
  "open_tree",
  "move_mount",
  "fsopen",
  "fsconfig",
  "fsmount",
  "fspick",
  "mount_setattr",
  "syslog",
  "keyctl",
  "add_key",
  "request_key",
  "name_to_handle_at",
  "open_by_handle_at",
  "quotactl",
  "quotactl_fd",
  "lookup_dcookie",
  "sethostname",
  "setdomainname",
  "reboot",
  "io_uring_setup",
  "io_uring_enter",
  "io_uring_register",
  "bpf",
  "perf_event_open",
  "fanotify_init",
  "userfaultfd",
  "kexec_load",
  "kexec_file_load",
  "init_module",
  "finit_module",
  "delete_module",
  "acct",
  "swapon",
  "swapoff",
  "iopl",
  "ioperm",
]

/** `clone` flags that make namespaces (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET). */
const CLONE_NAMESPACE_FLAGS = 0x7e020000

/** Docker's masked paths (read as empty), and `/proc/kallsyms`. */
export const maskedPaths: ReadonlyArray<string> = [
  "/proc/acpi",
  "/proc/asound",
  "/proc/kcore",
  "/proc/kallsyms",
  "/proc/keys",
  "/proc/latency_stats",
  "/proc/sched_debug",
  "/proc/scsi",
  "/proc/timer_list",
  "/proc/timer_stats",
  "/sys/firmware",
  "/sys/devices/virtual/powercap",
]

/** Docker's read-only paths. */
export const readonlyPaths: ReadonlyArray<string> = [
  "/proc/bus",
  "/proc/fs",
  "/proc/irq",
  "/proc/sys",
  "/proc/sysrq-trigger",
]

// ---------------------------------------------------------------------------------------------
// Seccomp

interface ProfileRule {
  readonly names?: ReadonlyArray<string>
  readonly name?: string
  readonly action: string
  readonly errnoRet?: number
  readonly args?: ReadonlyArray<{ index: number; value: number; valueTwo?: number; op: string }> | null
  readonly includes?: { caps?: ReadonlyArray<string>; arches?: ReadonlyArray<string> }
  readonly excludes?: { caps?: ReadonlyArray<string>; arches?: ReadonlyArray<string> }
}

interface Profile {
  readonly defaultAction: string
  readonly defaultErrnoRet?: number
  readonly syscalls: ReadonlyArray<ProfileRule>
}

export interface OciSeccompRule {
  readonly names: ReadonlyArray<string>
  readonly action: string
  readonly errnoRet?: number
  readonly args?: ReadonlyArray<{ index: number; value: number; valueTwo: number; op: string }>
}

export interface OciSeccomp {
  readonly defaultAction: string
  readonly defaultErrnoRet?: number
  readonly architectures: ReadonlyArray<string>
  readonly syscalls: ReadonlyArray<OciSeccompRule>
}

/** The profile's name for this machine's architecture and libseccomp's (only the native one: no 32-bit ABI). */
const archOf = (arch: string): { readonly profile: ReadonlyArray<string>; readonly scmp: string } => {
  if (arch === "x64") return { profile: ["amd64"], scmp: "SCMP_ARCH_X86_64" }
  if (arch === "arm64") return { profile: ["arm64"], scmp: "SCMP_ARCH_AARCH64" }
  throw new Error(`no seccomp architecture for ${arch}`)
}

/**
 * The OCI seccomp section from a Docker/Podman profile: rules kept when their `includes` and
 * `excludes` fit `caps` and `arch`, then tightened (see the module comment).
 */
export const seccompOf = (
  profile: Profile,
  caps: ReadonlyArray<string> = capabilities,
  arch: string = process.arch,
): OciSeccomp => {
  const a = archOf(arch)
  const has = (c: string) => caps.includes(c)
  const fits = (r: ProfileRule) =>
    (r.includes?.caps ?? []).every(has) &&
    !(r.excludes?.caps ?? []).some(has) &&
    ((r.includes?.arches ?? []).length === 0 ||
      (r.includes?.arches ?? []).some((x) => a.profile.includes(x))) &&
    !(r.excludes?.arches ?? []).some((x) => a.profile.includes(x))
  const dropped = new Set([...refusedSyscalls, "clone", "clone3"])
  const rules: Array<OciSeccompRule> = []
  for (const r of profile.syscalls) {
    if (!fits(r)) continue
    const names = (r.names ?? (r.name ? [r.name] : [])).filter((n) => !dropped.has(n))
    if (names.length === 0) continue
    const args = (r.args ?? []).map((x) => ({
      index: x.index,
      value: x.value,
      valueTwo: x.valueTwo ?? 0,
      op: x.op,
    }))
    rules.push({
      names,
      action: r.action,
      ...(r.errnoRet !== undefined ? { errnoRet: r.errnoRet } : {}),
      ...(args.length > 0 ? { args } : {}),
    })
  }
  rules.push(
    { names: [...refusedSyscalls], action: "SCMP_ACT_ERRNO", errnoRet: 1 },
    { names: ["clone3"], action: "SCMP_ACT_ERRNO", errnoRet: 38 },
    {
      names: ["clone"],
      action: "SCMP_ACT_ALLOW",
      args: [{ index: 0, value: CLONE_NAMESPACE_FLAGS, valueTwo: 0, op: "SCMP_CMP_MASKED_EQ" }],
    },
  )
  return {
    defaultAction: profile.defaultAction,
    ...(profile.defaultErrnoRet !== undefined ? { defaultErrnoRet: profile.defaultErrnoRet } : {}),
    architectures: [a.scmp],
    syscalls: rules,
  }
}

const profiles = new Map<string, OciSeccomp>()

/** The seccomp section from the profile file at `path`, read once per process. */
export const seccompFromFile = (path: string): OciSeccomp => {
  let s = profiles.get(path)
  if (s === undefined) {
    let profile: Profile
    try {
      profile = JSON.parse(readFileSync(path, "utf8")) as Profile
    } catch (e) {
      throw new Error(
        `cannot read the seccomp profile ${path} (Debian's golang-github-containers-common ships it): ${e instanceof Error ? e.message : String(e)}`,
      )
    }
    s = seccompOf(profile)
    profiles.set(path, s)
  }
  return s
}

// ---------------------------------------------------------------------------------------------
// The configuration

export interface MachineConfig {
  /** The machine id (crun's container id). */
  readonly id: string
  /** The first host id of the machine's range: guest id N is host id hostId + N. */
  readonly hostId: number
  /** The cgroup path below each controller's root (`/hangar/<id>`). */
  readonly cgroupsPath: string
  /** The host folder the guest sees as `/sys/fs/cgroup/memory` (its commands' groups). */
  readonly guestMemoryCgroup: string
  /** Bytes of `/dev/shm` (memory, charged to the machine). */
  readonly shmBytes: number
  readonly seccomp: OciSeccomp
  /**
   * `seccomp` as crun compiled it for an earlier machine (the filter's bytes, base64): crun loads
   * it as it is (`run.oci.seccomp_bpf_data`) instead of compiling the section again with
   * libseccomp (Debian's crun is built without its own cache): 33.6 → 27.8 ms of crun's CPU a start.
   */
  readonly seccompFilter?: string
  /** lxcfs's mount when it serves: its `/proc` files and CPU folder are bound over the machine's. */
  readonly lxcfs?: { readonly mount: string; readonly procFiles: ReadonlyArray<string> }
  /** The host CPUs the machine may run on (`0-1`, `1`); all when left out. */
  readonly cpus?: string
  /** The machine's first process (sshd) and its arguments. */
  readonly args: ReadonlyArray<string>
}

const bind = (source: string, destination: string, options: ReadonlyArray<string>) => ({
  destination,
  type: "bind",
  source,
  options: ["rbind", ...options],
})

/** The `config.json` of a machine whose root is the bundle's `root` folder. */
export const configOf = (m: MachineConfig) => ({
  ociVersion: "1.0.2",
  ...(m.seccompFilter === undefined ? {} : { annotations: { "run.oci.seccomp_bpf_data": m.seccompFilter } }),
  process: {
    terminal: false,
    user: { uid: 0, gid: 0 },
    args: [...m.args],
    env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"],
    cwd: "/",
    capabilities: {
      bounding: [...capabilities],
      effective: [...capabilities],
      permitted: [...capabilities],
    },
    noNewPrivileges: true,
  },
  root: { path: "root", readonly: false },
  hostname: "machine",
  mounts: [
    { destination: "/proc", type: "proc", source: "proc", options: ["nosuid", "noexec", "nodev"] },
    {
      destination: "/dev",
      type: "tmpfs",
      source: "tmpfs",
      options: ["nosuid", "strictatime", "mode=755", "size=65536k"],
    },
    {
      destination: "/dev/pts",
      type: "devpts",
      source: "devpts",
      options: ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
    },
    {
      destination: "/dev/shm",
      type: "tmpfs",
      source: "shm",
      options: ["nosuid", "noexec", "nodev", "mode=1777", `size=${m.shmBytes}`],
    },
    { destination: "/dev/mqueue", type: "mqueue", source: "mqueue", options: ["nosuid", "noexec", "nodev"] },
    { destination: "/sys", type: "sysfs", source: "sysfs", options: ["nosuid", "noexec", "nodev", "ro"] },
    {
      destination: "/sys/fs/cgroup",
      type: "tmpfs",
      source: "cgroup",
      options: ["nosuid", "noexec", "nodev", "mode=755", "size=64k"],
    },
    bind(m.guestMemoryCgroup, "/sys/fs/cgroup/memory", ["nosuid", "noexec", "nodev", "rw"]),
    ...(m.lxcfs === undefined
      ? []
      : [
          ...m.lxcfs.procFiles.map((f) =>
            bind(`${m.lxcfs?.mount}/proc/${f}`, `/proc/${f}`, ["nosuid", "noexec", "nodev", "ro"]),
          ),
          bind(`${m.lxcfs.mount}/sys/devices/system/cpu`, "/sys/devices/system/cpu", [
            "nosuid",
            "noexec",
            "nodev",
            "ro",
          ]),
        ]),
  ],
  linux: {
    uidMappings: [{ containerID: 0, hostID: m.hostId, size: ID_COUNT }],
    gidMappings: [{ containerID: 0, hostID: m.hostId, size: ID_COUNT }],
    namespaces: [
      { type: "pid" },
      { type: "ipc" },
      { type: "uts" },
      { type: "mount" },
      { type: "cgroup" },
      { type: "user" },
      { type: "network" },
    ],
    sysctl: {
      // The machine has no raw sockets (no `CAP_NET_RAW`): it pings with ICMP datagram sockets.
      "net.ipv4.ping_group_range": `0 ${ID_COUNT - 1}`,
      // sshd starts while the host sets up the machine's network (`NamespaceDriver`): it binds the
      // guest's address before its interface has it. Binding is all it allows: nothing is sent
      // from an address the machine does not have (the kernel finds no route for it without
      // `IP_TRANSPARENT`, which needs capabilities the machine lacks; `Policy.heavy.test.ts`).
      "net.ipv4.ip_nonlocal_bind": "1",
    },
    cgroupsPath: m.cgroupsPath,
    resources: {
      devices: [{ allow: false, access: "rwm" }],
      ...(m.cpus === undefined ? {} : { cpu: { cpus: m.cpus } }),
    },
    seccomp: m.seccomp,
    maskedPaths: [...maskedPaths],
    readonlyPaths: [...readonlyPaths],
  },
})
