#!/usr/bin/env python3
"""Write + fdatasync latency and bytes written, by how the file's space was made: appending
(the file grows on every write), into posix_fallocate'd space, or overwriting zeros already on
disk (what a preallocated log segment does; docs/STORAGE.md, "Preallocated segments").

    benches/fsync_patterns.py [DIR] [WRITE_BYTES] [WRITES]    (defaults: ., 16384, 1500)

Prints p50/p99/mean latency and the bytes the kernel wrote (/proc/self/io) per pattern, twice
in turn. `zeros-1m` fills with 1 MiB writes, `zeros` with 4 KiB ones (page-sized writes keep
small folios; a megabyte write leaves a large folio that each small write dirties whole).
"""
import os
import sys
import time

SEGMENT = 64 << 20


def written():
    for line in open("/proc/self/io"):
        if line.startswith("write_bytes"):
            return int(line.split()[1])


def run(directory, mode, size, count):
    path = os.path.join(directory, "fsync_patterns.tmp")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if mode == "fallocate":
            os.posix_fallocate(fd, 0, SEGMENT)
            os.fsync(fd)
        elif mode.startswith("zeros"):
            chunk = (1 << 20) if mode == "zeros-1m" else 4096
            zeros = bytes(chunk)
            for _ in range(SEGMENT // chunk):
                os.write(fd, zeros)
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        before, data, latencies = written(), b"x" * size, []
        for _ in range(count):
            started = time.perf_counter()
            os.write(fd, data)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - started)
        latencies.sort()
        print(f"{mode:10} p50 {latencies[count // 2] * 1e3:.3f} ms  p99 {latencies[int(count * 0.99)] * 1e3:.3f} ms  "
              f"mean {sum(latencies) / count * 1e3:.3f} ms  wrote {(written() - before) / 1e6:.1f} MB "
              f"for {size * count / 1e6:.1f} MB")
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 1500
    for _ in range(2):
        for mode in ("append", "fallocate", "zeros", "zeros-1m"):
            run(directory, mode, size, count)


if __name__ == "__main__":
    main()
