/**
 * The partition of an actor id: FNV-1a (32 bit) of its UTF-8 bytes modulo the partition count.
 * Stable across processes and versions: changing it would move every actor's mailbox.
 */

const encoder = new TextEncoder()

/** The partition in `[0, count)` that actor `id` belongs to. */
export const partitionOf = (id: string, count: number): number => {
  let hash = 0x811c9dc5
  for (const byte of encoder.encode(id)) {
    hash ^= byte
    hash = Math.imul(hash, 0x01000193) >>> 0
  }
  return hash % count
}
