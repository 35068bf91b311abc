/** TLS for test servers on loopback: a self-signed certificate made with openssl. */
import { spawnSync } from "node:child_process"
import { readFile } from "node:fs/promises"
import { join } from "node:path"

/** A self-signed P-256 certificate for 127.0.0.1, written into `dir` (key.pem, cert.pem). */
export const selfSigned = async (dir: string) => {
  const key = join(dir, "key.pem")
  const cert = join(dir, "cert.pem")
  const r = spawnSync("openssl", [
    "req",
    "-x509",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
    "-keyout",
    key,
    "-out",
    cert,
    "-days",
    "1",
    "-subj",
    "/CN=127.0.0.1",
    "-addext",
    "subjectAltName=IP:127.0.0.1",
  ])
  if (r.status !== 0) throw new Error(`openssl: ${r.stderr.toString()}`)
  return { key: await readFile(key), cert: await readFile(cert), certFile: cert }
}
