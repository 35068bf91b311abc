import { describe, expect, it } from "vitest"
import { capabilities, configOf, refusedSyscalls, seccompFromFile, seccompOf } from "./Oci.ts"

const profile = {
  defaultAction: "SCMP_ACT_ERRNO",
  defaultErrnoRet: 38,
  syscalls: [
    { names: ["read", "write", "mount", "unshare", "clone", "clone3"], action: "SCMP_ACT_ALLOW" },
    { names: ["chroot"], action: "SCMP_ACT_ALLOW", includes: { caps: ["CAP_SYS_CHROOT"] } },
    { names: ["bpf"], action: "SCMP_ACT_ALLOW", includes: { caps: ["CAP_SYS_ADMIN"] } },
    { names: ["arch_prctl"], action: "SCMP_ACT_ALLOW", includes: { arches: ["amd64", "x32"] } },
    { names: ["s390_pci_mmio_read"], action: "SCMP_ACT_ALLOW", includes: { arches: ["s390x"] } },
    {
      names: ["socket"],
      action: "SCMP_ACT_ALLOW",
      args: [{ index: 0, value: 16, op: "SCMP_CMP_NE" }],
      excludes: { caps: ["CAP_AUDIT_WRITE"] },
    },
    { names: ["socket"], action: "SCMP_ACT_ALLOW", includes: { caps: ["CAP_AUDIT_WRITE"] } },
  ],
}

const allowed = (s: ReturnType<typeof seccompOf>) =>
  new Set(s.syscalls.filter((r) => r.action === "SCMP_ACT_ALLOW" && !r.args).flatMap((r) => r.names))

describe("seccomp from a Docker/Podman profile", () => {
  it("keeps the rules that fit the capabilities and the architecture, and refuses the tightened set", () => {
    const s = seccompOf(profile, capabilities, "x64")
    expect(s.defaultAction).toBe("SCMP_ACT_ERRNO")
    expect(s.defaultErrnoRet).toBe(38)
    expect(s.architectures).toEqual(["SCMP_ARCH_X86_64"])
    const allow = allowed(s)
    for (const name of ["read", "write", "chroot", "arch_prctl", "socket"])
      expect(allow.has(name), name).toBe(true)
    // Rules for capabilities the machine lacks, or other architectures, are gone.
    expect(allow.has("bpf")).toBe(false)
    expect(allow.has("s390_pci_mmio_read")).toBe(false)
    // The rule that applies only without CAP_AUDIT_WRITE is gone (the machine has it).
    expect(s.syscalls.some((r) => r.names.includes("socket") && r.args)).toBe(false)
    // Podman allows mount and unshare to a root with CAP_SYS_ADMIN; here they are refused outright.
    expect(allow.has("mount")).toBe(false)
    expect(allow.has("unshare")).toBe(false)
    const refused = s.syscalls.find((r) => r.action === "SCMP_ACT_ERRNO" && r.errnoRet === 1)
    expect(refused?.names).toEqual(refusedSyscalls)
    // clone only without namespace flags; clone3 looks unimplemented so libc falls back to clone.
    expect(s.syscalls.find((r) => r.names.includes("clone"))).toEqual({
      names: ["clone"],
      action: "SCMP_ACT_ALLOW",
      args: [{ index: 0, value: 0x7e020000, valueTwo: 0, op: "SCMP_CMP_MASKED_EQ" }],
    })
    expect(s.syscalls.find((r) => r.names.includes("clone3"))).toMatchObject({
      action: "SCMP_ACT_ERRNO",
      errnoRet: 38,
    })
    // No syscall is both allowed and refused (libseccomp refuses such a filter).
    for (const name of refusedSyscalls) expect(allow.has(name), name).toBe(false)
  })

  it("reads Debian's profile, and says where it comes from when it is missing", () => {
    const s = seccompFromFile("/usr/share/containers/seccomp.json")
    const allow = allowed(s)
    for (const name of ["read", "execve", "openat", "chroot", "setuid"])
      expect(allow.has(name), name).toBe(true)
    for (const name of [
      "mount",
      "unshare",
      "setns",
      "keyctl",
      "syslog",
      "open_tree",
      "io_uring_setup",
      "bpf",
    ])
      expect(allow.has(name), name).toBe(false)
    expect(() => seccompFromFile("/nonexistent/seccomp.json")).toThrow(/golang-github-containers-common/)
  })

  it("refuses an architecture it has no filter for", () => {
    expect(() => seccompOf(profile, capabilities, "ia32")).toThrow(/no seccomp architecture/)
  })
})

describe("the machine's OCI configuration", () => {
  const machine = {
    id: "m1",
    hostId: 1_065_536,
    cgroupsPath: "/hangar/m1",
    guestMemoryCgroup: "/sys/fs/cgroup/memory/hangar/m1/cmds",
    shmBytes: 1024,
    args: ["/usr/sbin/sshd"],
  }

  it("maps the guest's ids to its own range and makes every namespace its own", () => {
    const c = configOf({ ...machine, seccomp: seccompOf(profile, capabilities, "x64"), cpus: "1" })
    expect(c.linux.uidMappings).toEqual([{ containerID: 0, hostID: 1_065_536, size: 65536 }])
    expect(c.linux.gidMappings).toEqual(c.linux.uidMappings)
    expect(c.linux.namespaces.map((n) => n.type).sort()).toEqual([
      "cgroup",
      "ipc",
      "mount",
      "network",
      "pid",
      "user",
      "uts",
    ])
    expect(c.process.capabilities.bounding).toEqual(capabilities)
    expect(c.process.noNewPrivileges).toBe(true)
    expect(c.linux.maskedPaths).toContain("/proc/kallsyms")
    expect(c.linux.readonlyPaths).toContain("/proc/sys")
    expect(c.linux.resources).toEqual({ devices: [{ allow: false, access: "rwm" }], cpu: { cpus: "1" } })
    // No compiled filter given: crun compiles the section itself.
    expect("annotations" in c).toBe(false)
  })

  it("hands crun a compiled filter as it is, beside the section it was compiled from", () => {
    const seccomp = seccompOf(profile, capabilities, "x64")
    const c = configOf({ ...machine, seccomp, seccompFilter: "IAAAAAQAAAA=" })
    expect(c.annotations).toEqual({ "run.oci.seccomp_bpf_data": "IAAAAAQAAAA=" })
    expect(c.linux.seccomp).toBe(seccomp)
  })
})
