/**
 * Async iterables whose end does not wait. `Stream.fromAsyncIterable` ends (finished, failed or
 * interrupted) by awaiting the iterator's `return()`; an async generator's `return()` waits for
 * the `next()` still pending, that is for a value that may never come (a NATS watch with no
 * change, a channel whose far end, a tenant's machine, never sends or closes), and the stream's
 * consumer, and whatever ends with it, never lets go.
 */

/**
 * `iterable` whose `return()` calls `end` (with the inner iterator: say, to stop its source, or to
 * call its own `return()` without awaiting it) and resolves at once.
 */
export const endingAtOnce = <T>(
  iterable: AsyncIterable<T>,
  end: (inner: AsyncIterator<T>) => void,
): AsyncIterable<T> => ({
  [Symbol.asyncIterator]: () => {
    const inner = iterable[Symbol.asyncIterator]()
    return {
      next: () => inner.next(),
      return: (value?: unknown) => {
        end(inner)
        return Promise.resolve({ done: true as const, value: value as T })
      },
    }
  },
})
