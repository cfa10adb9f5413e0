"""UDP echo on Python asyncio (selector event loop: epoll, non-blocking recvfrom/sendto).

    python3 echo_asyncio.py server ADDR PORT
    python3 echo_asyncio.py client ADDR PORT N INFLIGHT SIZE WARMUP

Same contract as echo_mt.c: the client sends WARMUP + N datagrams with INFLIGHT outstanding,
checks every reply (length, sequence seen once, every byte), prints "ok N datagrams in X ms" and
one JSON line; exit 1 on a bad or duplicate datagram, 2 when nothing came back for 5 s.
"""
import asyncio
import json
import os
import sys
import time


_tails = {}


def payload(seq, size):
    # The byte pattern depends on seq mod 256 only: 256 tails per size, made once.
    tails = _tails.get(size)
    if tails is None:
        tails = _tails[size] = [bytes((k * 7 + i * 13) & 0xFF for i in range(8, size)) for k in range(256)]
    return seq.to_bytes(8, "little") + tails[seq & 0xFF]


class Server(asyncio.DatagramProtocol):
    def connection_made(self, transport):
        self.t = transport

    def datagram_received(self, data, peer):
        self.t.sendto(data, peer)


class Client(asyncio.DatagramProtocol):
    def __init__(self, n, inflight, size, warmup, done):
        self.n, self.inflight, self.size, self.warmup, self.done = n, inflight, size, warmup, done
        self.total = warmup + n
        self.seen = bytearray(self.total)
        self.next = self.received = 0
        self.t0 = 0

    def connection_made(self, transport):
        self.t = transport
        if self.warmup == 0:
            self.t0 = time.perf_counter_ns()
        for _ in range(min(self.inflight, self.total)):
            self.send()

    def send(self):
        self.t.sendto(payload(self.next, self.size))
        self.next += 1

    def fail(self, code, msg):
        print("echo_asyncio.py: " + msg, file=sys.stderr, flush=True)
        os._exit(code)

    def datagram_received(self, data, peer):
        seq = int.from_bytes(data[:8], "little") if len(data) == self.size else -1
        if not 0 <= seq < self.total or data != payload(seq, self.size):
            self.fail(1, f"bad datagram ({len(data)} bytes)")
        if self.seen[seq]:
            self.fail(1, f"duplicate datagram {seq}")
        self.seen[seq] = 1
        self.received += 1
        if self.received == self.warmup:
            self.t0 = time.perf_counter_ns()
        if self.received == self.total:
            self.done.set_result((time.perf_counter_ns() - self.t0) / 1e6)
        elif self.next < self.total:
            self.send()


async def main():
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    loop = asyncio.get_running_loop()
    if mode == "server":
        await loop.create_datagram_endpoint(Server, local_addr=(addr, port))
        print("ready", flush=True)
        await loop.create_future()
    n, inflight, size, warmup = map(int, sys.argv[4:8])
    done = loop.create_future()
    proto = None

    def make():
        nonlocal proto
        proto = Client(n, inflight, size, warmup, done)
        return proto

    await loop.create_datagram_endpoint(make, remote_addr=(addr, port))
    last = -1
    while not done.done():
        await asyncio.wait([done], timeout=5)
        if not done.done():
            if proto.received == last:
                proto.fail(2, f"stalled: {proto.received} of {proto.total} replies (a datagram was lost)")
            last = proto.received
    ms = done.result()
    print(f"ok {n} datagrams in {ms:.3f} ms")
    print(json.dumps({"runtime": "python-asyncio", "n": n, "inflight": inflight, "size": size, "warmup": warmup,
                      "received": proto.received, "elapsed_ms": round(ms, 3), "ok": True}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] not in ("server", "client") or (sys.argv[1] == "client" and len(sys.argv) < 8):
        print(__doc__, file=sys.stderr)
        sys.exit(1)
    asyncio.run(main())
