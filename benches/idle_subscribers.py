#!/usr/bin/env python3
"""Resident memory an idle subscriber costs a node.

    benches/idle_subscribers.py PORT COUNT NODE_PID [TOPIC]

Opens COUNT WebSocket subscriptions to the node on 127.0.0.1:PORT (the topic must exist),
reads nothing after the upgrade, holds them for 2 s and prints how much the node's resident
memory (VmRSS of NODE_PID) grew per subscription. Raw sockets, no WebSocket library needed.
"""
import base64
import os
import socket
import sys
import time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise SystemExit(f"no VmRSS for pid {pid}")


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    port, count, pid = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    topic = sys.argv[4] if len(sys.argv) > 4 else "idle"
    before = rss_kib(pid)
    held = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            (
                f"GET /topics/{topic}/subscribe?subscriber_id=idle-{i}-{os.getpid()} HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        status = sock.recv(4096).split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise SystemExit(f"subscription {i} refused: {status.decode(errors='replace')}")
        held.append(sock)
    time.sleep(2)
    after = rss_kib(pid)
    print(f"{count} idle subscribers: RSS {before} KiB -> {after} KiB, {(after - before) / count:.1f} KiB each")


if __name__ == "__main__":
    main()
