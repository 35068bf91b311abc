/**
 * Choosing QEMU's accelerator. `/dev/kvm` existing is not enough: some hosts offer a nested,
 * paravirtual KVM on which stock kernels hang early in boot. So KVM is chosen only when the guest
 * kernel itself boots on it: a probe boots it with the initramfs in probe mode, which prints a mark
 * on the serial console and powers off at once. Otherwise machines run under TCG (emulation, slow:
 * fit for tests only).
 */
import { spawn } from "node:child_process"
import { access, constants, readFile } from "node:fs/promises"
import { PROBE_MARK } from "./Init.ts"
import type { Kernel } from "./Kernel.ts"

export type Accel = "kvm" | "tcg"

/** The probe's answer, with why for diagnostics. */
export interface Probe {
  readonly accel: Accel
  readonly detail: string
}

/** The machine type every machine uses: a microVM without PCI, option ROMs or firmware tables to emulate. */
export const MACHINE = "microvm,x-option-roms=off,isa-serial=on,rtc=on"

/** The host's TSC frequency in kHz; TCG guests need it given or they hang calibrating the clock. */
export const hostKhz = async (): Promise<number> => {
  const info = await readFile("/proc/cpuinfo", "utf8")
  const mhz = /cpu MHz\s*:\s*([\d.]+)/.exec(info)
  return mhz?.[1] ? Math.round(Number(mhz[1]) * 1000) : 1_000_000
}

/** Whether the guest kernel boots under KVM here, trying for at most `timeoutMs`. */
export const probe = async (
  qemu: string,
  kernel: Kernel,
  kvmDevice: string,
  timeoutMs: number,
): Promise<Probe> => {
  try {
    await access(kvmDevice, constants.R_OK | constants.W_OK)
  } catch {
    return { accel: "tcg", detail: `${kvmDevice} is not usable` }
  }
  return new Promise<Probe>((ok) => {
    const child = spawn(
      qemu,
      [
        ...["-M", MACHINE, "-accel", "kvm", "-cpu", "host", "-m", "256", "-smp", "1"],
        ...["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio"],
        ...["-kernel", kernel.vmlinuz, "-initrd", kernel.initrd],
        ...["-append", "console=ttyS0 panic=-1 quiet hangar.probe"],
      ],
      { stdio: ["ignore", "pipe", "pipe"] },
    )
    let out = ""
    let result: Probe | undefined
    // The answer is given once qemu is gone, so a probe never leaves a process behind.
    const decide = (p: Probe) => {
      result ??= p
      clearTimeout(timer)
      child.kill("SIGKILL")
    }
    const timer = setTimeout(
      () => decide({ accel: "tcg", detail: `the kernel did not boot under KVM within ${timeoutMs} ms` }),
      timeoutMs,
    )
    const take = (b: Buffer) => {
      out = (out + b.toString("utf8")).slice(-4000)
      if (out.includes(PROBE_MARK)) decide({ accel: "kvm", detail: "the kernel booted under KVM" })
    }
    child.stdout.on("data", take)
    child.stderr.on("data", take)
    child.on("error", (e) => {
      clearTimeout(timer)
      ok({ accel: "tcg", detail: `${qemu}: ${e.message}` })
    })
    child.on("close", (code) => {
      clearTimeout(timer)
      ok(result ?? { accel: "tcg", detail: `qemu exited ${code} under KVM: ${out.slice(-500)}` })
    })
  })
}
